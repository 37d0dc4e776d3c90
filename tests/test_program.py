"""Programs round-trip through disk; sessions give the same results before and after."""
from __future__ import annotations

import numpy as np
import pytest

from sdk import compiler
from sdk.errors import InputError, ProgramError
from sdk.models import bert
from sdk.program import Program, Usage
from sdk.session import Session

from .conftest import FIXTURES


def test_program_round_trips_through_disk(tmp_path):
    cfg, weights = bert.load(FIXTURES / "bert")
    graphs = [bert.graph(cfg, 1, 8), bert.graph(cfg, 2, 16)]
    program = compiler.compile(graphs, "cpu")
    loaded = Program.load(program.save(tmp_path / "p"))
    assert loaded == program
    assert set(loaded.buffers_of(Usage.WEIGHTS)) == set(program.buffers_of(Usage.WEIGHTS))
    assert loaded.entry("forward_b2_t16").inputs["ids"] == "forward_b2_t16/ids"


def test_entries_share_weights_and_check_inputs():
    cfg, weights = bert.load(FIXTURES / "bert")
    ids = np.arange(1, 9, dtype=np.int32)[None]
    with Session([bert.graph(cfg, 1, 8), bert.graph(cfg, 1, 16)], weights, device="cpu") as s:
        a = s.run("forward_b1_t8", ids=ids, token_types=0 * ids, mask=np.ones((1, 8), np.float32))["hidden"]
        ids16 = np.pad(ids, ((0, 0), (0, 8)))
        mask16 = np.pad(np.ones((1, 8), np.float32), ((0, 0), (0, 8)))
        b = s.run("forward_b1_t16", ids=ids16, token_types=0 * ids16, mask=mask16)["hidden"]
        assert np.abs(a - b[:, :8]).max() < 1e-5
        with pytest.raises(InputError, match="compiled for"):
            s.run("forward_b1_t8", ids=ids16, token_types=0 * ids16, mask=mask16)
        with pytest.raises(InputError, match="missing"):
            s.run("forward_b1_t8", ids=ids)
        with pytest.raises(ProgramError, match="no entry"):
            s.run("forward_b9", ids=ids)


def test_corrupt_program_folder_is_a_typed_error(tmp_path):
    (tmp_path / "program.json").write_text("{not json")
    with pytest.raises(ProgramError, match="cannot read"):
        Program.load(tmp_path)


def test_state_is_written_in_place_and_kept_per_stream():
    from sdk import ops
    from sdk.graph import trace

    def step(w, x, pos, state):
        cache = ops.cache_write(state["cache"], x, pos, axis=0)
        return {"total": ops.mean(cache, axis=0)}
    g = trace(step, name="step", weights={}, inputs={"x": ((1, 2), "float32")}, params={"pos": ((), "int32")},
              state={"cache": ((4, 2), "float32")})
    with Session([g], {}, device="cpu") as s:
        a, b = s.new_state(), s.new_state()
        for pos in range(3):
            out = s.run(state=a, x=np.full((1, 2), pos + 1, np.float32), pos=np.int32(pos))["total"]
        assert out.tolist() == [1.5, 1.5]  # (1 + 2 + 3 + 0) / 4
        assert not b.buffers["cache"].any()
