"""The error raised when data does not fit what a task expects."""


class DataError(ValueError):
    """The data does not fit what the task expects (a column, a split, the labels, a length)."""
