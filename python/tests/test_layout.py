# SPDX-License-Identifier: MIT
"""The ctypes declarations against the C compiler's view of kvtier.h: field names and order
(parsed from the header), sizes and offsets (from layout_probe), and the default values."""
import ctypes
import json
import os
import re
import subprocess
from dataclasses import fields

import pytest

import kvtier
from kvtier import _capi

STRUCTS = {
    "kvt_config": _capi.CConfig, "kvt_stats": _capi.Stats, "kvt_seq_info": _capi.SeqInfo,
    "kvt_recall_ref": _capi.RecallRef, "kvt_sched_config": _capi.CSchedConfig,
    "kvt_sched_item": _capi.SchedItem, "kvt_sched_iter": _capi.IterStats,
    "kvt_sched_batch": _capi.CSchedBatch, "kvt_pool_info": _capi.PoolInfo,
    "kvt_attn_tables": _capi.CAttnTables, "kvt_paged_tables": _capi.CPagedTables,
}


@pytest.fixture(scope="module")
def probe():
    path = os.environ.get("KVTIER_LAYOUT_PROBE")
    if not path:
        pytest.skip("KVTIER_LAYOUT_PROBE not set (run through meson test)")
    return json.loads(subprocess.run([path], check=True, capture_output=True, text=True).stdout)


def header_fields(struct):
    text = open(os.environ.get("KVTIER_HEADER", os.path.join(
        os.path.dirname(__file__), "..", "..", "include", "kvtier.h"))).read()
    body = re.search(r"struct %s \{(.*?)\n\};" % struct, text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    names = []
    for decl in body.split(";"):
        decl = re.sub(r"\s+", " ", decl.strip())
        if decl:
            rest = re.match(r"(?:const )?(?:struct |enum )?\w+ ?\**\s*(.*)", decl).group(1)
            names += [n.strip().lstrip("*") for n in rest.split(",")]
    return names


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_fields_follow_the_header(name):
    assert [f for f, _ in STRUCTS[name]._fields_] == header_fields(name)


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_layout_matches_the_compiler(probe, name):
    cls = STRUCTS[name]
    assert ctypes.sizeof(cls) == probe[name]["size"]
    for field, offset, size in probe[name]["fields"]:
        desc = getattr(cls, field)
        assert (field, desc.offset, desc.size) == (field, offset, size)


def test_config_defaults_are_kvt_config_init(probe):
    cfg = kvtier.Config()
    for key, want in probe["config_init"].items():
        assert getattr(cfg, key) == want, key
    assert cfg.spill_dir is None
    assert {f.name for f in fields(cfg)} == {f for f, _ in _capi.CConfig._fields_} - {
        "size", "version", "reserved"}


def test_sched_defaults_are_kvt_sched_config_init(probe):
    import inspect
    sig = inspect.signature(kvtier.Scheduler.__init__).parameters
    for key, want in probe["sched_config_init"].items():
        assert sig[key].default == want, key


def test_versions(probe):
    assert probe["versions"] == {"config": _capi.CONFIG_VERSION, "stats": _capi.STATS_VERSION,
                                 "sched_config": _capi.SCHED_CONFIG_VERSION}
    assert kvtier.version().split(".")[:2] == [str(_capi.ABI_MAJOR), str(_capi.ABI_MINOR)]
