#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Derives the damaged checkpoint seeds in fuzz_checkpoint/ from valid_double.ckpt, which the harness itself
# writes through the library's writer (DPMLP_FUZZ_WRITE_SEED=<path> ./fuzz_checkpoint). Some keep a valid
# FNV-1a checksum (recomputed here), so that the fuzzer starts from inputs that pass the checksum and reach
# the checks after it. Layout: magic 8, version 4, scalar 4, widths count 4, widths 4 each, activation 4,
# name length 4, name, state length 8, parameter count 8, step count 8, values, checksum 8. Run from this folder.
import struct


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def resum(body):
    return bytes(body[:-8]) + struct.pack("<Q", fnv1a64(body[:-8]))


d = "fuzz_checkpoint/"
b = open(d + "valid_double.ckpt", "rb").read()
assert struct.unpack("<Q", b[-8:])[0] == fnv1a64(b[:-8]), "the checksum is not FNV-1a 64 of the rest"
steps_at = 40 + 4 + 16  # after the name "adam" (4 bytes), the state length and the parameter count


def variant(name, offset, value, resummed):
    x = bytearray(b)
    x[offset:offset + len(value)] = value
    open(d + name, "wb").write(resum(x) if resummed else bytes(x))


open(d + "truncated.ckpt", "wb").write(b[:100])
variant("checksum_mismatch.ckpt", len(b) - 20, bytes([b[-20] ^ 0x40]), False)
variant("version2.ckpt", 8, struct.pack("<I", 2), False)
variant("float32_header.ckpt", 12, struct.pack("<I", 4), False)
variant("name_length_flipped.ckpt", 36, struct.pack("<I", 0x7FFFFFFF), False)
variant("bad_magic.ckpt", 0, b"DPMLPCK2", False)
variant("steps_int64_max_resummed.ckpt", steps_at, struct.pack("<Q", (1 << 63) - 1), True)
variant("width_changed_resummed.ckpt", 20, struct.pack("<I", 5), True)
variant("activation_changed_resummed.ckpt", 32, struct.pack("<I", 0), True)
variant("optimizer_sgd_resummed.ckpt", 40, b"sgd ", True)
