"""Evaluation metrics: accuracy, confusion matrix, corpus BLEU (through sacrebleu)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from zoo.extras import pip_install


def _class_ids(values: npt.ArrayLike, name: str) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one class id per example (1-D), got shape {array.shape}")
    if array.size and array.dtype.kind not in "iub":
        raise ValueError(f"{name} must be integer class ids, got dtype {array.dtype}")
    return array.astype(np.int64)


def _paired(labels: npt.ArrayLike, predictions: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    truth, guess = _class_ids(labels, "labels"), _class_ids(predictions, "predictions")
    if truth.shape != guess.shape:
        raise ValueError(f"{len(truth)} labels but {len(guess)} predictions; give one per example")
    return truth, guess


def accuracy(labels: npt.ArrayLike, predictions: npt.ArrayLike) -> float:
    """Fraction of examples whose prediction equals the label."""
    truth, guess = _paired(labels, predictions)
    if truth.size == 0:
        raise ValueError("accuracy of no examples is undefined; pass at least one")
    return float(np.mean(truth == guess))


def confusion_matrix(
    labels: npt.ArrayLike, predictions: npt.ArrayLike, num_classes: int
) -> np.ndarray:
    """`int64[num_classes, num_classes]`: entry [i, j] counts examples of class i predicted as j."""
    truth, guess = _paired(labels, predictions)
    for name, values in (("labels", truth), ("predictions", guess)):
        bad = values[(values < 0) | (values >= num_classes)]
        if bad.size:
            raise ValueError(
                f"{name} {sorted(set(bad.tolist()))[:10]} lie outside [0, num_classes="
                f"{num_classes}); pass the model's num_classes"
            )
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (truth, guess), 1)
    return matrix


def bleu(hypotheses: Sequence[str], references: Sequence[str] | Sequence[Sequence[str]]) -> float:
    """Corpus BLEU (0-100) of detokenized `hypotheses` against `references`.

    `references` holds one reference per hypothesis, or a list of references per hypothesis.
    Scored by sacrebleu with its default 13a tokenization, the number papers report.
    """
    try:
        import sacrebleu
    except ImportError as error:
        raise ImportError(
            f"BLEU needs sacrebleu: {pip_install('bleu')} (or pip install sacrebleu)"
        ) from error
    hypotheses = list(hypotheses)
    per_hypothesis = [[ref] if isinstance(ref, str) else list(ref) for ref in references]
    if len(per_hypothesis) != len(hypotheses):
        raise ValueError(
            f"{len(hypotheses)} hypotheses but {len(per_hypothesis)} references; give one "
            "reference (or one list of references) per hypothesis"
        )
    counts = {len(refs) for refs in per_hypothesis}
    if len(counts) > 1:
        raise ValueError(
            f"every hypothesis needs the same number of references, got {sorted(counts)}"
        )
    if not hypotheses:
        raise ValueError("BLEU of no sentences is undefined; pass at least one hypothesis")
    streams = [list(stream) for stream in zip(*per_hypothesis)]  # sacrebleu: one list per ref set
    return float(sacrebleu.corpus_bleu(hypotheses, streams).score)
