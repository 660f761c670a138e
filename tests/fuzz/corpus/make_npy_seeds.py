#!/usr/bin/env python3
# SPDX-License-Identifier: BSD-3-Clause
# Writes the .npy seeds in fuzz_npy/ byte for byte as numpy.save does (format 1.0: magic, version, a 2-byte
# little-endian header length, the dict padded with spaces to a multiple of 64 bytes and ended by '\n';
# format 2.0: a 4-byte length), without needing numpy. Run from this folder.
import struct


def npy(descr, shape, data, fortran=False, version=(1, 0)):
    shape_text = "()" if not shape else "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"
    header = f"{{'descr': '{descr}', 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    length_bytes = 2 if version == (1, 0) else 4
    fixed = 6 + 2 + length_bytes
    pad = (64 - (fixed + len(header) + 1) % 64) % 64
    header = header + " " * pad + "\n"
    length = struct.pack("<H" if length_bytes == 2 else "<I", len(header))
    return b"\x93NUMPY" + bytes(version) + length + header.encode("latin1") + data


def write(name, blob):
    with open("fuzz_npy/" + name, "wb") as f:
        f.write(blob)


write("valid_f4_3x2.npy", npy("<f4", (3, 2), struct.pack("<6f", *range(6))))
write("valid_f8_3x2.npy", npy("<f8", (3, 2), struct.pack("<6d", -1, -0.6, -0.2, 0.2, 0.6, 1)))
write("valid_f8_2.npy", npy("<f8", (2,), struct.pack("<2d", 1.5, -2.0)))
write("valid_f4_scalar.npy", npy("<f4", (), struct.pack("<f", 3.0)))
write("version2_f8_2.npy", npy("<f8", (2,), struct.pack("<2d", 1.0, 2.0), version=(2, 0)))
write("fortran_f8_3x2.npy", npy("<f8", (3, 2), struct.pack("<6d", *[1.0] * 6), fortran=True))
write("big_endian_f8_2.npy", npy(">f8", (2,), struct.pack(">2d", 0.0, 1.0)))
write("int64_2.npy", npy("<i8", (2,), struct.pack("<2q", 0, 1)))
write("truncated_f8_3x2.npy", npy("<f8", (3, 2), struct.pack("<6d", *[0.5] * 6))[:-5])
write("huge_shape_f8.npy", npy("<f8", (1 << 62, 1 << 62), b""))
