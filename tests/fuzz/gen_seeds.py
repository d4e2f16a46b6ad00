#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the hand-made seeds of the fuzz corpora (tests/fuzz/corpus/<target>/seed-*).

Run from anywhere: python3 tests/fuzz/gen_seeds.py. Trace seeds are slices of
tests/data/traces and traces/; selection seeds of tests/data/selections plus a few written here;
preset seeds are tests/data/presets plus valid and refused preset files written here; API seeds are operation sequences in fuzz_api.c's encoding (opcode byte, then its arguments).
Seeds are deterministic, so re-running rewrites the same files."""
import os
import pathlib

here = pathlib.Path(__file__).resolve().parent
root = here.parent.parent


def put(target, name, data):
    d = here / 'corpus' / target
    d.mkdir(parents=True, exist_ok=True)
    (d / ('seed-' + name)).write_bytes(data)


# ---- fuzz_trace: the sample traces, whole (they are small), and slices of the bundled one
for f in sorted((root / 'tests' / 'data' / 'traces').iterdir()):
    put('fuzz_trace', f.name, f.read_bytes()[:4096])
bundled = (root / 'traces' / 'mooncake_synthetic.jsonl').read_bytes().splitlines(True)
put('fuzz_trace', 'mooncake_synthetic_head.jsonl',
    b''.join(bundled[:3]).replace(b', 1', b'')[:2048])
put('fuzz_trace', 'mooncake_short.jsonl',
    b'{"timestamp": 5, "input_length": 10, "output_length": 2}\n'
    b'{"timestamp": 1, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n')
put('fuzz_trace', 'azure_crlf.csv',
    b'TIMESTAMP,ContextTokens,GeneratedTokens\r\n'
    b'2023-11-16 18:17:03.9799600,4808,10\r\n2023-11-16 18:17:02,1,1')
put('fuzz_trace', 'vidur_quoted.csv',
    b'"arrived_at","num_prefill_tokens","num_decode_tokens"\n"1.5"," 2 ",3.0\n0,1,1\n')
put('fuzz_trace', 'burstgpt_bom.csv',
    b'\xef\xbb\xbfTimestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n'
    b'1e3,m,1,0,1,x\n2,m,5,5,10,x\n')
put('fuzz_trace', 'nul.csv', b'arrived_at,num_prefill_tokens,num_decode_tokens\n1,\x002,3\n')

# ---- fuzz_selfile
for f in sorted((root / 'tests' / 'data' / 'selections').iterdir()):
    put('fuzz_selfile', f.name, f.read_bytes()[:4096])
put('fuzz_selfile', 'small.txt', b'# r = 3\n0 0 0 0 1 2 4\n0 0 0 1\n2 3 1 1 0 12\n\n1 0 1 0 0\n')
put('fuzz_selfile', 'tabs_crlf.txt', b'\t0\t1\t0\t0\t5\r\n0 0 1 1 4294967295\r\n')
put('fuzz_selfile', 'repeat.txt', b'0 0 0 0 1\n0 0 0 0 2\n')
put('fuzz_selfile', 'bad_field.txt', b'0 0 x 0\n')
put('fuzz_selfile', 'overflow.txt', b'0 0 0 0 4294967296\n')
put('fuzz_selfile', 'missing.txt', b'1 2 3\n')
put('fuzz_selfile', 'empty.txt', b'')

# ---- fuzz_preset: every field once, then one file per kind of refusal
for f in sorted((root / 'tests' / 'data' / 'presets').iterdir()):
    put('fuzz_preset', f.name, f.read_bytes()[:4096])
put('fuzz_preset', 'full.json',
    b'{"model": {"name": "m-full", "n_layers": 4, "n_q_heads": 8, "n_kv_heads": 2,\n'
    b'  "head_dim": 64, "params": 1.5e8, "elem_bytes": 4, "max_context": 4294967295},\n'
    b' "gpu": {"name": "g-full", "hbm_gib": 24, "hbm_gbps": 936.2, "tflops": 71,\n'
    b'  "h2d_gbps": 12.5, "d2h_gbps": 13, "call_ns": 1500, "launch_ns": 4000,\n'
    b'  "linear_eff": [[1, 0.5], [64, 0.625], [4096, 0.9]],\n'
    b'  "prefill_attn_eff": [[256, 0.1], [16384, 1]], "decode_attn_eff": 0.75,\n'
    b'  "decode_attn_layer_us": 0, "kv_write_eff": 1, "iter_overhead_us": 37.5,\n'
    b'  "source": "seed: every field"}}\n')
put('fuzz_preset', 'gpu_only.json',
    b'{"gpu": {"linear_eff": [[16, 1]], "prefill_attn_eff": [[1, 0.2], [2, 0.3], [3, 0.4]],'
    b' "iter_overhead_us": 0, "source": ""}}')
put('fuzz_preset', 'empty_objects.json', b'{"model": {}, "gpu": {}}')
put('fuzz_preset', 'extremes.json',
    b'{"gpu": {"hbm_gbps": 1e300, "tflops": 5e-324, "decode_attn_eff": 1e-320,\n'
    b' "linear_eff": [[1e-5, 1], [1e7, 0.5]], "call_ns": 1e20},\n'
    b' "model": {"params": 1e-3, "n_layers": 4294967295, "n_kv_heads": 1}}')
put('fuzz_preset', 'bad_eff.json',
    b'{"gpu": {"decode_attn_eff": 1.5, "kv_write_eff": 0}}')
put('fuzz_preset', 'bad_curve_order.json',
    b'{"gpu": {"linear_eff": [[16, 0.5], [4, 0.6]]}}')
put('fuzz_preset', 'bad_curve_pair.json',
    b'{"gpu": {"prefill_attn_eff": [[1, 0.5], [2], ["3", 0.5], [4, 0.5, 6]]}}')
put('fuzz_preset', 'bad_curve_long.json',
    b'{"gpu": {"linear_eff": [' +
    b', '.join(b'[%d, 1]' % (i + 1) for i in range(25)) + b']}}')
put('fuzz_preset', 'bad_numbers.json',
    b'{"gpu": {"hbm_gbps": 0, "iter_overhead_us": -1, "decode_attn_layer_us": "5"}}')
put('fuzz_preset', 'bad_u32.json',
    b'{"model": {"n_layers": 2.5, "head_dim": 4294967296, "max_context": -1}}')
put('fuzz_preset', 'bad_heads.json', b'{"model": {"n_q_heads": 32,\n "n_kv_heads": 5}}')
put('fuzz_preset', 'long_names.json',
    b'{"model": {"name": "%s"},\n "gpu": {"name": "%sX", "source": "%s"}}' %
    (b'n' * 31, b'g' * 31, b's' * 96))
put('fuzz_preset', 'unknown.json', b'{"model": {"layers": 2}, "cpu": {}, "gpu": 5}')
put('fuzz_preset', 'dup_gpu.json',
    b'{"gpu": {"source": "a",\n  "linear_eff": [[1, 1]],\n  "source": "b"}}')
put('fuzz_preset', 'nested_junk.json',
    b'\xef\xbb\xbf{"gpu": {"name": [{"a": [[{"b": null, "c": "\\u00e9\\"}"}]], "a": 2}],\n'
    b' "source": {"x": true}}, "model": [1, {"name": "x"}]}')
put('fuzz_preset', 'not_object.json', b'[{"model": {"n_layers": 8}}]')
put('fuzz_preset', 'truncated.json', b'{"model": {"n_layers": 8},\n "gpu": {"linear_eff": [[1, ')

# ---- fuzz_api: opcodes of fuzz_api.c's ops[]
(CREATE, PREFILL, DECODE, DECODE2, DRECALL, RBLOCKS, PREEMPT, RESUME, READ, ATTEND, INFO,
 FRAMES, VIEW, RESIDENT, DESTROY, SPILL, FETCH, SYNC, READSEQ, PREFILL2, CREATE2,
 SBEGIN, SAPPEND, SAPPEND2, SRECALL, SRBLOCKS, SEND, ABATCH, SATTEND, STABLES, RDEV,
 SRDEV, CPREFIX, CHUNK, CHUNK2, LOADKV, PMATCH, CPREFIX2, SPAGED, SCHED) = range(40)


def api(cfg_a, cfg_b, *ops):
    out = bytearray([cfg_a, cfg_b])
    for op in ops:
        out += bytes(op)
    return bytes(out)


def life(slot, prompt, decodes=4, seed=7):
    """create, prefill both layers, decode a few steps on both layers."""
    ops = [(CREATE, slot, prompt - 1), (PREFILL, slot, 0, seed), (PREFILL, slot, 1, seed)]
    for _ in range(decodes):
        ops += [(DECODE, 0, 0, slot), (DECODE, 1, 0, slot)]
    return ops


basic = life(0, 60) + [(READ, 0, 0, 3, 0), (ATTEND, 0, 0, 9), (INFO, 0, 0), (FRAMES, 0, 0),
                       (RESIDENT, 0, 0), (READSEQ, 0)]
recall = life(0, 90, 2) + life(1, 70, 2) + [
    (DRECALL, 0, 5, 1, 0, 1), (VIEW, 0, 0), (ATTEND, 0, 0, 5), (RBLOCKS, 1, 2, 0, 1, 2, 3, 4),
    (VIEW, 1, 1), (ATTEND, 1, 1, 3), (DRECALL, 0, 9, 3, 0, 1, 2, 3)]
preempt = life(0, 40) + life(2, 20) + [
    (PREEMPT, 2), (READ, 2, 1, 5, 0), (DECODE, 0, 1, 0, 2), (RESUME, 2), (ATTEND, 2, 1, 1),
    (PREEMPT, 2), (PREEMPT, 2), (RESUME, 0), (DESTROY, 2), (DESTROY, 2), (CREATE, 2, 10),
    (PREFILL, 2, 0, 1)]
errors = [(CREATE, 0, 250), (CREATE, 0, 251), (CREATE, 0, 252), (CREATE, 0, 5),
          (CREATE, 0, 5), (PREFILL, 0, 2, 0), (PREFILL, 0, 0xe0, 0), (DECODE, 0, 1, 0, 0),
          (DECODE, 0, 0, 240), (PREFILL, 0, 0, 0), (PREFILL, 0, 0, 0), (DECODE, 0, 1, 0, 0),
          (DECODE, 2, 0, 0), (RBLOCKS, 0, 0, 0, 0), (RBLOCKS, 0, 1, 0, 0, 200, 255),
          (READ, 0, 0, 0xff, 0xff), (INFO, 240, 0), (INFO, 0, 250), (FRAMES, 0, 0x80),
          (RESIDENT, 0, 0x81), (VIEW, 0, 0xf1), (ATTEND, 245, 0, 0), (DESTROY, 250)]
full = []
for s in range(6):
    full += life(s, 95, 3, s)
full += [(PREEMPT, 0), (PREEMPT, 1), (RESUME, 0), (RESUME, 1), (SPILL, 2), (FETCH, 1, 2, 3),
         (READSEQ, 2), (SYNC,)]
disk = life(0, 80, 2) + life(1, 80, 2) + [(SPILL, 0), (READ, 0, 0, 10, 0), (FETCH, 0, 0),
                                            (SPILL, 1), (SPILL, 1), (FETCH, 1, 0, 1),
                                            (DECODE, 0, 1, 0, 1), (SPILL, 240)]
# decode steps: a step over sequences 0 and 1, layer by layer (append, recall, batched
# attention, attention tables, their paged form with room and without), selections in
# device memory (one naming a block past its member's history), then the step's calls with
# a member destroyed, created again and prefilled, preempted and resumed, a step begun over a
# repeated id and one ended twice
step = life(0, 90, 2) + life(1, 70, 2) + [
    (SBEGIN, 0, 1, 0, 1), (SAPPEND, 0), (SRECALL, 0, 5), (SATTEND, 0, 5), (STABLES, 0, 5),
    (SPAGED, 0, 0, 0, 0), (SPAGED, 0, 0x81, 0, 0), (SPAGED, 0, 0, 0x82, 0),
    (SPAGED, 0, 0, 0, 0x83), (SAPPEND, 1), (SRBLOCKS, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3),
    (SATTEND, 1, 6), (SPAGED, 1, 0, 0, 0), (SPAGED, 2, 0, 0, 0),
    (ABATCH, 1, 7, 1, 1, 0), (SEND,),
    (SATTEND, 0, 1), (STABLES, 1, 1), (ABATCH, 0, 2, 1, 0, 0),
    (RDEV, 1, 2, 1, 0, 1, 0, 1, 2, 3, 0, 1, 2, 3), (RDEV, 0, 1, 1, 0, 1, 0, 1, 30, 31),
    (SBEGIN, 0x81, 0), (SAPPEND, 0), (SAPPEND, 1), (DESTROY, 1), (SAPPEND, 0), (SRECALL, 0, 3),
    (CREATE, 1, 40), (PREFILL, 1, 0, 2), (PREFILL, 1, 1, 2), (SAPPEND, 0), (SRECALL, 1, 4),
    (SRDEV, 0, 1, 0, 1, 2, 31), (SRDEV, 1, 2, 0, 1, 2, 3, 0, 1, 2, 3),
    (PREEMPT, 0), (SAPPEND, 1), (RESUME, 0), (SAPPEND, 1), (SEND,), (SEND,), (SAPPEND, 0),
    (SBEGIN, 0, 1, 0, 0), (SBEGIN, 0, 2, 0, 1, 240), (SRECALL, 0, 1)]
# prefix reuse and prefill in pieces: a sequence on chain 0 (four spans) prefilled whole on
# layer 0 and in three chunks on layer 1, then sequences on chain 1 (its first span shared)
# and chain 0 (all four), loads of the shared rows, their rest prefilled as a chunk from the
# match (and the layer from its start), decodes and a recall over them; then bad chains
prefix = [(CPREFIX, 0, 89, 0x10), (PREFILL, 0, 0, 7), (CHUNK, 0, 1, 20, 7), (CHUNK, 0, 1, 0xbf, 7),
          (CHUNK, 0, 1, 14, 7), (PMATCH, 0x10), (PMATCH, 0x11), (CPREFIX, 1, 89, 0x11),
          (CPREFIX, 2, 89, 0x10), (LOADKV, 2, 0x0c, 3), (LOADKV, 1, 0x10, 0),
          (CHUNK, 2, 0x00, 0xbe, 3), (CHUNK, 2, 0x11, 0xbe, 3), (CHUNK, 1, 0x00, 0xbe, 3),
          (CHUNK, 1, 0x61, 3, 3), (PREFILL, 1, 1, 3), (DECODE, 0, 2, 0, 1, 2),
          (DECODE, 1, 2, 0, 1, 2), (DRECALL, 0, 5, 2, 0, 1, 2), (READSEQ, 2), (READSEQ, 1),
          (CPREFIX, 3, 10, 0xf0), (CPREFIX, 3, 5, 0x10), (CHUNK, 0, 0, 0xf9, 0),
          (LOADKV, 0, 0x80, 0xff), (DESTROY, 0), (CPREFIX, 0, 89, 0x10), (READSEQ, 0)]
# the scheduler: three requests submitted before their prefill, iterations stepped, executed
# and committed until they complete (prefill layers, then decode steps), a step before the
# commit, a commit without a step, a request finished early, one whose sequence the engine
# destroyed, calls without a scheduler, then a scheduler created again with tight limits
sched = [(CREATE, 0, 60), (CREATE, 1, 40), (CREATE, 2, 90), (SCHED, 2, 0, 0),
         (SCHED, 0, 0x7f, 0), (SCHED, 1, 0, 3), (SCHED, 1, 1, 5), (SCHED, 1, 2, 2),
         (SCHED, 1, 0, 3), (SCHED, 1, 4, 1), (SCHED, 1, 2, 0)]
sched += [(SCHED, 2, 0, 0), (SCHED, 2, 0, 0), (SCHED, 3, 0, 7)] * 3
sched += [(SCHED, 3, 0, 1), (SCHED, 4, 1, 0), (DESTROY, 2)]
sched += [(SCHED, 2, 0, 0), (SCHED, 3, 0, 9)] * 4
sched += [(SCHED, 5, 0, 0), (SCHED, 2, 0, 0), (SCHED, 4, 0, 0), (CREATE, 3, 80),
          (CREATE, 4, 70), (SCHED, 0, 0x41, 0), (SCHED, 1, 3, 7), (SCHED, 1, 4, 7),
          (SCHED, 1, 0, 7)]
sched += [(SCHED, 2, 0, 0), (SCHED, 3, 0, 4)] * 8
# config byte a: bit0 save thread, bits1-2 dtype, bits3-4 device, bits5-6 host, bit7 disk
for i, (a, b) in enumerate([(0x00, 0x00), (0x01, 0x00), (0x7b, 0x10), (0x02, 0x31),
                            (0x04, 0x42), (0x79, 0x83), (0x99, 0x20)]):
    put('fuzz_api', 'basic-%d' % i, api(a, b, *basic))
    put('fuzz_api', 'recall-%d' % i, api(a, b, *recall))
    put('fuzz_api', 'preempt-%d' % i, api(a, b, *preempt))
put('fuzz_api', 'errors', api(0x78, 0x00, *errors))
put('fuzz_api', 'errors-norecall', api(0x78, 0x0c, *errors, *recall))
for i, (a, b) in enumerate([(0x78, 0x00), (0x00, 0x00), (0x79, 0x30), (0x19, 0x01)]):
    put('fuzz_api', 'full-%d' % i, api(a, b, *full))
for i, (a, b) in enumerate([(0x80, 0x00), (0x81, 0x10), (0xa3, 0x31), (0xfb, 0x00)]):
    put('fuzz_api', 'disk-%d' % i, api(a, b, *disk))
for i, (a, b) in enumerate([(0x79, 0x30), (0x7b, 0x34), (0xf9, 0x70), (0x7c, 0xb2)]):
    put('fuzz_api', 'step-%d' % i, api(a, b, *step))
for i, (a, b) in enumerate([(0x79, 0x30), (0x7b, 0x03), (0xf9, 0x70), (0x19, 0x41)]):
    put('fuzz_api', 'prefix-%d' % i, api(a, b, *prefix))
for i, (a, b) in enumerate([(0x79, 0x30), (0x01, 0x00), (0xf9, 0x70), (0x7b, 0x34)]):
    put('fuzz_api', 'sched-%d' % i, api(a, b, *sched))
put('fuzz_api', 'short', b'\x00')
