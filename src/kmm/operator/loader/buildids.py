"""Reading GNU build-ids in POSIX shell (pure text): the loader's check that
the module the kernel holds is the image's (``scripts``).

Kbuild links every module with ``--build-id=sha1``: the ``.ko`` carries a
``.note.gnu.build-id`` section, and the kernel shows the same note of a
loaded module at ``/sys/module/NAME/notes/.note.gnu.build-id``.
(``srcversion`` exists only with ``MODULE_VERSION``; ``modinfo`` prints
no build-id.) ``LIBRARY`` defines shell functions that read both:

- ``kmm_ko_id FILE``: ``kmm_r`` = the build-id of the ELF file ``FILE`` in
  hex, read through its section headers: ``e_shoff``, ``e_shentsize`` and
  ``e_shnum`` from the ELF header, then each ``SHT_NOTE`` section's offset
  and size (ELF32 or ELF64, either byte order), then its notes. A
  compressed ``.ko`` (``.xz``, ``.gz``, ``.zst``) is unpacked with the
  image's decompressor first. ``kmm_endian``: the file's byte order
  (``EI_DATA``, which the kernel's notes share). When it cannot be read,
  ``kmm_r`` is empty and ``kmm_why`` says why: no ``od``, no decompressor,
  not an ELF file, no build-id note.
- ``kmm_note ENDIAN BYTE...``: ``kmm_r`` = the GNU build-id among ELF notes
  given as decimal bytes (a note: ``namesz``, ``descsz``, ``type`` of 4
  bytes each, then the name and the descriptor, each padded to 4 bytes;
  the build-id is type 3, name ``GNU\0``), as the kernel's notes file
  holds them.

Only ``od`` (POSIX; in coreutils, busybox and toybox) reads bytes, as
decimal words (``od -An -v -t u1 -j SKIP -N COUNT``); shell arithmetic
does the rest. Module images are anyone's: ``xxd``, ``hexdump``,
``readelf`` and ``awk`` are often missing, and a helper binary of kmm's
would need kmm's image on every node (an init container copying it into
the pod) for what a page of shell does. A module's few dozen section
headers are read with one ``od`` and no other process.

Positional parameters are the only arrays POSIX shell has: a function
loads the bytes with ``set --`` and reads ``${N}`` through ``eval``
(``kmm_refs`` writes the references). Functions return through globals
(``kmm_r``, ``kmm_n``, ``kmm_why``), each prefixed ``kmm_`` and distinct per
function (no ``local`` in POSIX sh).
"""

from __future__ import annotations

from typing import Final

__all__ = ["LIBRARY"]

LIBRARY: Final = r"""# kmm_refs FIRST COUNT: kmm_s = ' ${FIRST} ... ${FIRST+COUNT-1}', to eval.
kmm_refs() {
    kmm_s=
    kmm_k=0
    while [ "$kmm_k" -lt "$2" ]; do
        kmm_s="$kmm_s \${$(($1 + kmm_k))}"
        kmm_k=$((kmm_k + 1))
    done
}
# kmm_num ENDIAN BYTE...: kmm_n = their unsigned value (ELF's EI_DATA: 1 little, 2 big).
kmm_num() {
    kmm_x=$1
    shift
    kmm_n=0
    kmm_t=0
    for kmm_b; do
        if [ "$kmm_x" = 2 ]; then
            kmm_n=$(((kmm_n << 8) + kmm_b))
        else
            kmm_n=$((kmm_n + (kmm_b << kmm_t)))
            kmm_t=$((kmm_t + 8))
        fi
    done
}
# kmm_note ENDIAN BYTE...: kmm_r = the descriptor of the GNU build-id note
# (type 3, name "GNU\0") among the ELF notes BYTE..., in hex; empty if none.
# A note: namesz, descsz, type (4 bytes each), the name and the descriptor,
# each padded to 4 bytes.
kmm_note() {
    kmm_ne=$1
    shift
    kmm_r=
    kmm_p=1
    while [ $((kmm_p + 11)) -le $# ]; do
        kmm_refs "$kmm_p" 4
        eval "kmm_num $kmm_ne $kmm_s"
        kmm_nsz=$kmm_n
        kmm_refs $((kmm_p + 4)) 4
        eval "kmm_num $kmm_ne $kmm_s"
        kmm_dsz=$kmm_n
        kmm_refs $((kmm_p + 8)) 4
        eval "kmm_num $kmm_ne $kmm_s"
        kmm_q=$((kmm_p + 12 + (kmm_nsz + 3) / 4 * 4))
        if [ "$kmm_n" -eq 3 ] && [ "$kmm_nsz" -eq 4 ] && [ "$kmm_dsz" -gt 0 ] &&
            [ $((kmm_q + kmm_dsz - 1)) -le $# ]; then
            kmm_refs $((kmm_p + 12)) 4
            eval "kmm_name=\"$kmm_s\""
            if [ "$kmm_name" = " 71 78 85 0" ]; then
                kmm_refs "$kmm_q" "$kmm_dsz"
                eval "kmm_r=\$(printf %02x $kmm_s)"
                return
            fi
        fi
        kmm_p=$((kmm_q + (kmm_dsz + 3) / 4 * 4))
    done
}
# kmm_bytes FILE [SKIP COUNT]: the file's bytes as decimal words.
kmm_bytes() {
    if [ $# -eq 1 ]; then
        od -An -v -t u1 "$1"
    else
        od -An -v -t u1 -j "$2" -N "$3" "$1"
    fi
}
# kmm_ko_id FILE: kmm_r = the build-id of the ELF file FILE (a .ko, maybe
# compressed), kmm_endian its byte order; kmm_r empty and kmm_why set when
# it cannot be read.
kmm_ko_id() {
    kmm_r=
    kmm_why=
    kmm_f=$1
    if ! command -v od >/dev/null 2>&1; then
        kmm_why="od is not in the image"
        return
    fi
    case $kmm_f in
    *.ko) ;;
    *.ko.xz) kmm_unpack xz "$kmm_f" || return ;;
    *.ko.gz) kmm_unpack gzip "$kmm_f" || return ;;
    *.ko.zst) kmm_unpack zstd "$kmm_f" || return ;;
    *)
        kmm_why="$kmm_f is not a .ko file"
        return
        ;;
    esac
    kmm_elf_id "$kmm_f"
    [ "$kmm_f" = "$1" ] || rm -f "$kmm_f"
    [ -n "$kmm_r" ] || [ -n "$kmm_why" ] || kmm_why="$1 has no GNU build-id note"
}
kmm_unpack() {
    if ! command -v "$1" >/dev/null 2>&1; then
        kmm_why="$2 is compressed and $1 is not in the image"
        return 1
    fi
    kmm_f="${TMPDIR:-/tmp}/kmm-loader.$$.ko"
    if ! "$1" -dc "$2" >"$kmm_f" 2>/dev/null; then
        rm -f "$kmm_f"
        kmm_why="$1 could not decompress $2"
        return 1
    fi
}
# kmm_elf_id FILE: the build-id among FILE's SHT_NOTE (7) sections, found
# through its section headers (ELF32 or ELF64, either byte order).
kmm_elf_id() {
    set -- $(kmm_bytes "$1" 0 64)
    if [ $# -lt 52 ] || [ "$1 $2 $3 $4" != "127 69 76 70" ]; then
        kmm_why="$kmm_f is not an ELF file"
        return
    fi
    kmm_endian=$6
    case $5 in
    2) kmm_refs 41 8; kmm_at=59; kmm_w=8; kmm_o=24 ;;
    1) kmm_refs 33 4; kmm_at=47; kmm_w=4; kmm_o=16 ;;
    *) kmm_why="$kmm_f has an unknown ELF class $5"; return ;;
    esac
    case $kmm_endian in
    1 | 2) ;;
    *) kmm_why="$kmm_f has an unknown ELF byte order $kmm_endian"; return ;;
    esac
    eval "kmm_num $kmm_endian $kmm_s"
    kmm_shoff=$kmm_n
    kmm_refs "$kmm_at" 2
    eval "kmm_num $kmm_endian $kmm_s"
    kmm_shent=$kmm_n
    kmm_refs $((kmm_at + 2)) 2
    eval "kmm_num $kmm_endian $kmm_s"
    kmm_shnum=$kmm_n
    if [ "$kmm_shnum" -eq 0 ] || [ "$kmm_shent" -lt $((kmm_o + 2 * kmm_w)) ]; then
        kmm_why="$kmm_f has no section headers"
        return
    fi
    set -- $(kmm_bytes "$kmm_f" "$kmm_shoff" $((kmm_shnum * kmm_shent)))
    if [ $# -ne $((kmm_shnum * kmm_shent)) ]; then
        kmm_why="$kmm_f: its section headers are cut short"
        return
    fi
    kmm_notes=
    kmm_i=0
    while [ "$kmm_i" -lt "$kmm_shnum" ]; do
        kmm_h=$((kmm_i * kmm_shent + 1))
        kmm_refs $((kmm_h + 4)) 4
        eval "kmm_num $kmm_endian $kmm_s"
        if [ "$kmm_n" -eq 7 ]; then
            kmm_refs $((kmm_h + kmm_o)) "$kmm_w"
            eval "kmm_num $kmm_endian $kmm_s"
            kmm_so=$kmm_n
            kmm_refs $((kmm_h + kmm_o + kmm_w)) "$kmm_w"
            eval "kmm_num $kmm_endian $kmm_s"
            [ "$kmm_n" -eq 0 ] || kmm_notes="$kmm_notes $kmm_so:$kmm_n"
        fi
        kmm_i=$((kmm_i + 1))
    done
    for kmm_sec in $kmm_notes; do
        kmm_note "$kmm_endian" $(kmm_bytes "$kmm_f" "${kmm_sec%%:*}" "${kmm_sec#*:}")
        [ -z "$kmm_r" ] || return
    done
}
"""
