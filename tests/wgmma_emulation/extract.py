# SPDX-License-Identifier: BSD-3-Clause
"""Text extraction for the emulated kernel tests' generators (generate.py here and in ../f16x3_emulation/): a
piece of the library's headers between two markers, and a replacement in it, each an error (naming the
generator to update) where its text is not found, so a test cannot drift from the kernels unnoticed."""
import os
import sys


def _script():
    return os.path.relpath(os.path.abspath(sys.argv[0]))


def between(text, start, end, name, keep_end=False):
    i = text.find(start)
    if i < 0:
        sys.exit(f"{_script()}: '{start}' not found ({name}): update {_script()}")
    j = text.find(end, i + len(start))
    if j < 0:
        sys.exit(f"{_script()}: the end of '{start}' not found ({name})")
    return text[i:j + (len(end) if keep_end else 0)]


def replace(text, old, new, name):
    if old not in text:
        sys.exit(f"{_script()}: '{old}' not found ({name}): update {_script()}")
    return text.replace(old, new)
