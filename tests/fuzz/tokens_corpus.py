#!/usr/bin/env python3
"""Writes the seed corpus of fuzz_tokens (tests/fuzz/corpus/tokens): a few llm.c token files,
valid and not, and text files. Usage: tests/fuzz/tokens_corpus.py [DIR]"""
import os
import struct
import sys

out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), 'corpus', 'tokens')
os.makedirs(out, exist_ok=True)


def header(magic=20240520, version=1, n=0):
    return struct.pack('<256i', magic, version, n, *([0] * 253))


def tokens(values):
    return struct.pack('<%dH' % len(values), *values)


files = {
    'valid.bin': header(n=24) + tokens([(i * 37) % 256 for i in range(24)]),
    'gpt2.bin': header(n=20) + tokens([50256, 464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290] * 2),
    'beyond-vocab.bin': header(n=20) + tokens([5] * 10 + [65535] + [5] * 9),
    'truncated.bin': header(n=100) + tokens(list(range(10))),
    'odd-bytes.bin': header(n=18) + tokens(list(range(18))) + b'\x07',
    'wrong-magic.bin': header(magic=12345, n=18) + tokens(list(range(18))),
    'negative-count.bin': header(n=-1),
    'short-header.bin': header(n=18)[:100],
    'text.txt': b'The quick brown fox jumps over the lazy dog. It ran away.\n',
    'binary.txt': bytes(range(256)),
    'empty': b'',
}
for name, data in files.items():
    with open(os.path.join(out, name), 'wb') as f:
        f.write(data)
