"""Audio ingest decodes clips in a thread pool (data/audio.py `decoded_in_order`): the dataset holds
the clips in the source's order whatever order the threads finish in, decoding runs a bounded number
of clips ahead of the writer, and a refusal stops the clips not started."""

import threading
import time

import numpy as np
import pytest

from jepa_cli.data import store
from jepa_cli.data.audio import decoded_in_order, ingest_audio
from jepa_cli.data.samples import AudioSource, BadSample
from jepa_cli.errors import InputError

RATE = 1000  # Hz: a clip of 0.01 s is 10 samples


def constant_clips(count: int, started: list[int] | None = None, bad: int | None = None) -> AudioSource:
    """Clip i is 10 samples of the value i / 100, decoded more slowly the smaller i is (so the
    threads finish out of order); clip `bad` cannot be decoded. `started` records each decode begun."""

    def read(i: int, sample_rate: int) -> tuple[np.ndarray, float]:
        if started is not None:
            started.append(i)
        time.sleep(0.002 * (count - i))
        if i == bad:
            raise BadSample(f"clip{i}: cannot decode")
        return np.full(10, i / 100, np.float32), 0.01

    return AudioSource("constant clips", count, read, lambda i: f"clip{i}", np.arange(count, dtype=np.int32) % 2,
                       ["even", "odd"])


def test_clips_are_written_in_the_sources_order_though_the_threads_finish_in_reverse(tmp_path):
    out = tmp_path / "clips.zarr"
    ingest_audio(constant_clips(12), out, sample_rate=RATE, seconds=0.01, workers=4)
    inputs = store.open_array(out / "inputs").read().result()
    expected = np.repeat((np.arange(12) / 100).astype(np.float32)[:, None], 10, axis=1)
    np.testing.assert_array_equal(inputs, expected)
    np.testing.assert_array_equal(store.open_array(out / "labels").read().result(), [0, 1] * 6)


def test_the_pool_yields_each_index_in_the_order_given():
    finish_order: list[int] = []

    def load(i: int) -> int:
        time.sleep(0.001 * (10 - i))
        finish_order.append(i)
        return i * i

    results = [(index, future.result()) for index, future in decoded_in_order(load, list(range(10)), 3)]
    assert results == [(i, i * i) for i in range(10)]
    assert finish_order != sorted(finish_order)  # the threads did finish out of order


def test_decoding_runs_at_most_four_clips_per_worker_ahead_of_the_consumer():
    submitted = []
    lock = threading.Lock()

    def load(i: int) -> int:
        with lock:
            submitted.append(i)
        return i

    consumed = 0
    for index, future in decoded_in_order(load, list(range(40)), 2):
        future.result()
        time.sleep(0.002)  # time for decoding to run further ahead, were it unbounded
        with lock:
            assert len(submitted) - consumed <= 4 * 2
        consumed += 1
    assert consumed == 40


def test_an_undecodable_clip_stops_the_clips_not_yet_started_and_writes_nothing(tmp_path):
    started: list[int] = []
    out = tmp_path / "clips.zarr"
    with pytest.raises(InputError, match="^clip0: cannot decode$"):
        ingest_audio(constant_clips(200, started, bad=0), out, sample_rate=RATE, seconds=0.01, workers=1)
    assert not out.exists()
    # one worker, four clips queued: clip 0, and at most the clip its thread took up as clip 0 failed
    assert started[0] == 0 and len(started) <= 2
