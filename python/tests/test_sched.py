# SPDX-License-Identifier: MIT
"""The scheduler through the binding: an engine loop that creates, submits, executes each
batch (prefill layers, decode steps with recall) and commits until every request is done."""
import errno

import numpy as np
import pytest

import kvtier
from conftest import SMALL


def run_engine(m, s, prompts, max_new, rng):
    c = m.config
    H, Hq, D = c.n_kv_heads, c.n_q_heads, c.head_dim
    for seq, T in prompts.items():
        m.create_seq(seq, T)
        s.submit(seq, max_new)
    produced = {seq: 0 for seq in prompts}
    completed, iterations = [], 0
    while s.pending:
        b = s.step()
        assert not b.failed
        for seq in b.completed:
            completed.append(seq)
            m.destroy_seq(seq)
        for it in b.prefills:
            T = prompts[it.seq]
            for layer in range(it.layer_begin, it.layer_end):
                k = rng.standard_normal((H, T, D)).astype(np.float32)
                q = rng.standard_normal((Hq, c.obs_window, D)).astype(np.float32)
                m.prefill_layer(it.seq, layer, k, k, q)
            if it.layer_end == c.n_layers:
                produced[it.seq] += 1
        dec = [it.seq for it in b.decodes]
        if dec:
            for layer in range(c.n_layers):
                k = rng.standard_normal((len(dec), H, D)).astype(np.float32)
                m.decode_append(layer, dec, k, k)
                m.decode_recall(layer, dec,
                                rng.standard_normal((len(dec), Hq, D)).astype(np.float32))
            for seq in dec:
                produced[seq] += 1
        s.commit()
        assert s.last().iteration == b.it.iteration
        iterations += 1
        assert iterations < 10_000
    b = s.step()  # reports the completions of the last commit
    completed += b.completed
    for seq in b.completed:
        m.destroy_seq(seq)
    s.commit()
    return produced, completed, iterations


def test_engine_loop_completes_every_request(rng):
    with kvtier.Manager(**SMALL) as m, kvtier.Scheduler(m, max_requests=4) as s:
        prompts = {100 + i: 60 + 37 * i for i in range(6)}
        produced, completed, iterations = run_engine(m, s, prompts, 5, rng)
        assert sorted(completed) == sorted(prompts)
        assert all(n == 5 for n in produced.values())
        assert m.stats().live_seqs == 0
        assert iterations >= 5


def test_scheduler_errors(mgr):
    with kvtier.Scheduler(mgr) as s:
        assert s.last_error == ""
        with pytest.raises(kvtier.Error) as e:
            s.submit(5, 3)
        assert e.value.errno == errno.ENOENT
        # the scheduler's detail, the manager's within it
        assert e.value.detail.startswith("submit: ") and "5" in e.value.detail
        assert s.last_error.startswith(e.value.detail)
        mgr.create_seq(5, 40)
        s.submit(5, 3)
        with pytest.raises(kvtier.Error) as e:
            s.submit(5, 3)
        assert e.value.errno == errno.EEXIST
        assert e.value.detail == "submit: sequence 5: already queued"
        with pytest.raises(kvtier.Error) as e:
            s.commit()
        assert e.value.errno == errno.EINVAL
        assert "no batch to commit" in e.value.detail
        s.step()
        with pytest.raises(kvtier.Error) as e:
            s.step()
        assert e.value.errno == errno.EBUSY
        assert "not committed" in str(e.value)
        s.finish(5)
        assert s.pending == 0
        with pytest.raises(kvtier.Error) as e:
            s.finish(5)
        assert e.value.detail == "finish: sequence 5: not scheduled here"
    with pytest.raises(kvtier.Error):
        kvtier.Scheduler(mgr, max_requests=0)


def test_closing_the_manager_closes_its_scheduler():
    m = kvtier.Manager(**SMALL)
    s = kvtier.Scheduler(m)
    m.close()
    with pytest.raises(ValueError, match="closed"):
        s.step()
    s.close()
