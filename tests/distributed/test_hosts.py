"""Joining many processes: what is asked for (arguments, variables, "auto"), the errors that
say how to ask, and the refusal once JAX has started. The run itself: test_two_processes.py."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import zoo
from zoo.cli import build_parser
from zoo.cli._mesh import join_processes
from zoo.distributed.hosts import (
    gather,
    initialize,
    is_writer,
    process_label,
    resolve_request,
)
from zoo.distributed.mesh import resolve_sizes

VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


@pytest.fixture(autouse=True)
def no_variables(monkeypatch):
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_nothing_asked_is_one_process():
    assert resolve_request() is None
    assert zoo.distributed.initialize() is False  # nothing happens, even after JAX started
    assert is_writer() and process_label() == ""


def test_arguments_and_variables():
    assert resolve_request("10.0.0.1:1234", 2, 1) == {
        "coordinator_address": "10.0.0.1:1234",
        "num_processes": 2,
        "process_id": 1,
    }
    assert resolve_request("auto") == {}  # JAX detects SLURM, Open MPI, TPU pods
    assert resolve_request("auto", 4) == {"num_processes": 4}


def test_variables_are_read_and_arguments_win(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "host0:999")
    monkeypatch.setenv("JAX_NUM_PROCESSES", "4")
    monkeypatch.setenv("JAX_PROCESS_ID", "3")
    assert resolve_request() == {
        "coordinator_address": "host0:999",
        "num_processes": 4,
        "process_id": 3,
    }
    assert resolve_request(process_id=0)["process_id"] == 0
    monkeypatch.setenv("JAX_PROCESS_ID", "one")
    with pytest.raises(ValueError, match="JAX_PROCESS_ID='one' is not a whole number"):
        resolve_request()


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (("host:1234", 2, 2), "process id 2 is out of range for 2 processes: number the "
         "processes 0 to 1"),
        (("host:1234", 2, -1), "process id -1 is negative"),
        (("host:1234", None, 0), "a run on many processes needs the number of processes: "
         "give all three: --coordinator HOST:PORT --num-processes N --process-id I"),
        ((None, 2, 0), "needs a coordinator address: give all three"),
        (("host:1234", 2, None), "needs this process's id"),
        (("host", 2, 0), "coordinator address 'host' is not HOST:PORT; give process 0's host"),
        (("host:1234", 0, 0), "the number of processes must be at least 1, got 0"),
    ],
)  # fmt: skip
def test_partial_or_wrong_requests_say_what_to_give(request_, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_request(*request_)


def test_after_jax_started_it_says_to_call_it_first():
    jax.devices()  # the backend is running, as it is in any test process
    with pytest.raises(RuntimeError, match=r"came after JAX had started .* call it first thing"):
        initialize("localhost:1234", 2, 0)


def test_the_command_line_options_reach_initialize():
    parser = build_parser()
    args = parser.parse_args(["train", "gpt", "--data", "synthetic:addition", "--out", "x",
                              "--coordinator", "h:1", "--num-processes", "2", "--process-id", "5"])  # fmt: skip
    with pytest.raises(ValueError, match="process id 5 is out of range for 2 processes"):
        join_processes(args)
    auto = parser.parse_args(["eval", "d", "--data", "json:x", "--distributed", "auto",
                              "--coordinator", "h:1"])  # fmt: skip
    with pytest.raises(ValueError, match="--distributed auto finds the coordinator itself"):
        join_processes(auto)
    bench = parser.parse_args(["bench", "--mesh", "data=1"])
    assert join_processes(bench) is False  # no process options there


def test_a_mesh_for_another_device_count_names_the_processes():
    with pytest.raises(ValueError, match=r"needs 4 devices but there are 8 cpu devices \(4 on "
                       r"each of 2 processes\); make the sizes multiply to 8"):  # fmt: skip
        resolve_sizes("data=4", 8, "cpu", processes=2)


def test_gather_on_one_process_is_a_copy_to_host():
    tree = {"a": jax.numpy.arange(3.0), "b": [jax.numpy.ones((2, 2))]}
    host = gather(tree)
    assert isinstance(host["a"], np.ndarray)
    np.testing.assert_array_equal(host["b"][0], np.ones((2, 2)))
