"""The POSIX shell scripts of a loader pod's hooks (pure text).

``load_script`` is the ``postStart`` hook, ``unload_script`` the ``preStop``
one; ``builders`` puts them in the pod template (``/bin/sh -c SCRIPT``).
They run in the Module's image, which is anyone's: they rely on ``sh``, the
image's ``modprobe`` and ``rmmod`` (kmod's, or busybox's), and ``od`` (in
coreutils, busybox and toybox alike) to read ELF files (``buildids``, which
says why nothing of kmm's is shipped into the pod).

The load, step by step (each one's failure ends the hook, below). First
``modprobe -D -d DIR NAME`` lists the ``.ko`` files the load would insert
(dependencies and softdeps first), changing nothing.

1. ``inTreeModulesToRemove``: each name the kernel holds is removed with
   ``rmmod NAME``, which asks the kernel by name. ``modprobe -r`` would
   look the name up in the container's ``/lib/modules`` (the image's tree,
   which never holds the node's in-tree modules: "Module dummy not
   found"). A name the kernel does not hold is done; a built-in one cannot
   be removed, and the hook says so; one of the listed files' modules
   whose build the kernel holds (an out-of-tree module replacing the
   in-tree one of its name, its loader restarted) stays.
2. ``firmwarePath`` is copied to the node's ``/lib/firmware``.
3. Each listed module the kernel already holds is compared by GNU
   build-id: the kernel's
   (``/sys/module/M/notes/.note.gnu.build-id``) against the ``.ko``'s note
   (its ELF section headers read with ``od``). If any differs, or cannot be
   compared (no ``od``, a compressed ``.ko`` without its decompressor, no
   note), every listed module the kernel holds is removed, last loaded
   first: ``modprobe`` of a loaded name exits 0 and does nothing, so v2's
   load would otherwise keep v1. A module still in use fails here, with the
   kernel's answer, and the kubelet retries the hook with its back-off.
4. ``modprobe -v -d DIR NAME PARAMETERS`` (``args.load`` included).
5. Each listed module must now be live in the kernel, and its build-id the
   ``.ko``'s where both are readable. Where they are not, the module was not
   held before step 4 (step 3 removed it), so ``modprobe`` just inserted
   the image's file.

A kernel without module support (no ``/proc/modules``: this machine's, and
the sandbox's container nodes, whose ``modprobe`` only records its calls)
can hold no module: steps 1, 3 and 5 say "not verifiable" in the
container's log and do nothing, and step 4 runs as written. ``rawArgs``
names no module kmm could check: steps 3 and 5 are skipped, saying so.

Reporting: every step logs a ``kmm-loader:`` line to the hook's output and
to the container's log (``/proc/1/fd/1``, the main process's stdout). A
failure writes ``WHAT: OUTPUT`` (the command's or check's words, the
kernel's answer among them: "Key was rejected by service", "Unknown
symbol in module", "Module kmmdemo is in use") to ``REPORT_PATH``, the
container's ``terminationMessagePath``, then exits 1. The kubelet then
kills the container and keeps that file as ``lastState.terminated.message``,
which the operator reads (``reports``): the Module's ``ModuleLoadFailed``.
The first report of a container wins: the kubelet runs ``preStop`` after a
failed ``postStart``, and that unload's failure must not hide why the load
failed. ``unload_script`` runs ``unload_commands`` with the same reporting.

``KMM_LOADER_ROOT`` (unset in pods) prefixes ``/proc``, ``/sys`` and the report
file, so tests run the scripts against a fake kernel's tree.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from typing import Final

from kmm.operator.loader import buildids as loader_buildids

__all__ = ["REPORT_PATH", "load_script", "normalized", "unload_script"]

#: The loader container's ``terminationMessagePath`` (the kubelet's default).
REPORT_PATH: Final = "/dev/termination-log"

# Reporting, shared by both hooks. kmm_fail exits the hook; it is never
# called inside $(...), where it would end a subshell only.
_REPORTING: Final = r"""set -f
KMM_REPORT="${KMM_LOADER_ROOT:-}@REPORT@"
kmm_log() {
    printf 'kmm-loader: %s\n' "$1"
    { printf 'kmm-loader: %s\n' "$1" >>"${KMM_LOADER_ROOT:-}/proc/1/fd/1"; } 2>/dev/null || :
}
kmm_fail() {
    kmm_log "$1"
    if [ ! -s "$KMM_REPORT" ]; then
        { printf '%s\n' "$1" >"$KMM_REPORT"; } 2>/dev/null
    fi
    exit 1
}
# kmm_run WHAT COMMAND...: run it; on failure report WHAT and its output.
kmm_run() {
    kmm_what=$1
    shift
    kmm_out=$("$@" 2>&1)
    kmm_rc=$?
    [ -z "$kmm_out" ] || printf '%s\n' "$kmm_out"
    [ "$kmm_rc" -eq 0 ] || kmm_fail "$kmm_what: ${kmm_out:-exit code $kmm_rc}"
}
"""

# What the kernel holds: whether it has module support, a module's state.
_KERNEL: Final = r"""kmm_modular() { [ -e "${KMM_LOADER_ROOT:-}/proc/modules" ]; }
# kmm_state NAME: kmm_r = live, coming, going (loaded), builtin or absent.
kmm_state() {
    kmm_d="${KMM_LOADER_ROOT:-}/sys/module/$1"
    if [ -r "$kmm_d/initstate" ]; then
        kmm_r=
        read -r kmm_r <"$kmm_d/initstate" || :
        [ -n "$kmm_r" ] || kmm_r=live
    elif [ -d "$kmm_d" ]; then
        kmm_r=builtin
    else
        kmm_r=absent
    fi
}
"""

# The load's steps (the build-ids they compare: ``buildids``).
_STEPS: Final = r"""# kmm_compare NAME KO: kmm_same = yes, no or unknown; kmm_detail says which
# builds (the kernel's, the .ko's).
kmm_compare() {
    kmm_endian=1
    if [ -n "$2" ]; then
        kmm_ko_id "$2"
    else
        kmm_r=
        kmm_why="modprobe -D named no file for $1"
    fi
    kmm_image=$kmm_r
    kmm_held=
    kmm_nf="${KMM_LOADER_ROOT:-}/sys/module/$1/notes/.note.gnu.build-id"
    if [ -n "$kmm_image" ]; then
        if [ -r "$kmm_nf" ]; then
            kmm_note "$kmm_endian" $(kmm_bytes "$kmm_nf")
            kmm_held=$kmm_r
            [ -n "$kmm_held" ] || kmm_why="$kmm_nf holds no GNU build-id"
        else
            kmm_why="the kernel shows no build-id of $1 ($kmm_nf)"
        fi
    fi
    if [ -z "$kmm_image" ] || [ -z "$kmm_held" ]; then
        kmm_same=unknown
        kmm_detail="not verifiable: $kmm_why"
    elif [ "$kmm_image" = "$kmm_held" ]; then
        kmm_same=yes
        kmm_detail="build $kmm_held, the image's $2"
    else
        kmm_same=no
        kmm_detail="the kernel holds build $kmm_held, the image's $2 is build $kmm_image"
    fi
}
# kmm_remove_in_tree NAME...: remove those the kernel holds, but one of
# the load's own modules that is the image's build (a restarted loader
# whose module replaces an in-tree one of its name finds its own).
kmm_remove_in_tree() {
    if ! kmm_modular; then
        kmm_log "in-tree modules $*: not verifiable, the kernel has no module support (no /proc/modules): none is loaded"
        return
    fi
    for kmm_m; do
        kmm_state "$kmm_m"
        case $kmm_r in
        absent)
            kmm_log "in-tree module $kmm_m: not loaded"
            continue
            ;;
        builtin) kmm_fail "removing the in-tree module $kmm_m: it is built into the kernel and cannot be removed" ;;
        esac
        for kmm_e in $kmm_list; do
            [ "${kmm_e%%=*}" = "$kmm_m" ] || continue
            kmm_compare "$kmm_m" "${kmm_e#*=}"
            if [ "$kmm_same" = yes ]; then
                kmm_log "in-tree module $kmm_m: the kernel holds the image's own, kept: $kmm_detail"
                continue 2
            fi
        done
        kmm_run "removing the in-tree module $kmm_m (rmmod $kmm_m)" rmmod "$kmm_m"
    done
}
# kmm_probe DIR NAME NORMALIZED: kmm_list = 'module=file ...' that loading
# NAME inserts, in load order (modprobe -D); kmm_checked = no without
# module support. It runs first, and changes nothing.
kmm_probe() {
    kmm_list=
    kmm_checked=yes
    if ! kmm_modular; then
        kmm_checked=no
        kmm_log "$2: not verifiable, the kernel has no module support (no /proc/modules)"
        return
    fi
    if ! kmm_out=$(modprobe -D -d "$1" "$2" 2>&1); then
        kmm_log "$2: modprobe -D -d $1 $2 failed, so only $2 is checked: $kmm_out"
        kmm_list="$3="
        return
    fi
    while read -r kmm_verb kmm_path kmm_rest; do
        [ "$kmm_verb" = insmod ] || continue
        kmm_base=${kmm_path##*/}
        kmm_base=${kmm_base%%.ko*}
        kmm_m=
        while :; do
            case $kmm_base in
            *-*) kmm_m="$kmm_m${kmm_base%%-*}_"; kmm_base=${kmm_base#*-} ;;
            *) kmm_m="$kmm_m$kmm_base"; break ;;
            esac
        done
        # Once each: modprobe -D lists a module that is both a softdep
        # (modulesLoadingOrder) and a dependency (modules.dep) twice.
        case " $kmm_list " in
        *" $kmm_m="*) ;;
        *) kmm_list="$kmm_list $kmm_m=$kmm_path" ;;
        esac
    done <<KMM_EOF
$kmm_out
KMM_EOF
    case " $kmm_list" in
    *" $3="*) ;;
    *) kmm_list="$kmm_list $3=" ;;
    esac
}
# kmm_unload_stale: if the kernel holds a listed module that is not
# provably the image's build, remove every listed module it holds, last
# loaded first (a holder before what it uses).
kmm_unload_stale() {
    [ "$kmm_checked" = yes ] || return 0
    kmm_stale=
    kmm_reverse=
    for kmm_e in $kmm_list; do
        kmm_reverse="$kmm_e $kmm_reverse"
        kmm_m=${kmm_e%%=*}
        kmm_state "$kmm_m"
        case $kmm_r in absent | builtin) continue ;; esac
        kmm_compare "$kmm_m" "${kmm_e#*=}"
        if [ "$kmm_same" = yes ]; then
            kmm_log "$kmm_m: already loaded, $kmm_detail"
        else
            kmm_stale="$kmm_stale; $kmm_m: $kmm_detail"
        fi
    done
    [ -n "$kmm_stale" ] || return 0
    kmm_log "unloading what the kernel holds first${kmm_stale}"
    for kmm_e in $kmm_reverse; do
        kmm_m=${kmm_e%%=*}
        kmm_state "$kmm_m"
        case $kmm_r in absent | builtin) continue ;; esac
        # Each module's own reason, so a failure says which build is held.
        kmm_compare "$kmm_m" "${kmm_e#*=}"
        if [ "$kmm_same" = yes ]; then
            kmm_reason="the image's own build, unloaded as it uses one that is not"
        else
            kmm_reason=$kmm_detail
        fi
        kmm_run "unloading $kmm_m, loaded before this load ($kmm_reason)" rmmod "$kmm_m"
    done
}
# kmm_verify NAME: every listed module is live, and the image's build.
kmm_verify() {
    [ "$kmm_checked" = yes ] || return 0
    for kmm_e in $kmm_list; do
        kmm_m=${kmm_e%%=*}
        kmm_state "$kmm_m"
        case $kmm_r in
        live) ;;
        builtin) kmm_fail "$kmm_m is built into the kernel: the image's module was not loaded" ;;
        absent) kmm_fail "$kmm_m: modprobe exited 0, but the kernel does not hold $kmm_m" ;;
        *) kmm_fail "$kmm_m: modprobe exited 0, but the kernel's $kmm_m is $kmm_r" ;;
        esac
        kmm_compare "$kmm_m" "${kmm_e#*=}"
        case $kmm_same in
        yes) kmm_log "$kmm_m: loaded, $kmm_detail" ;;
        no) kmm_fail "$kmm_m: modprobe exited 0, but $kmm_detail" ;;
        *) kmm_log "$kmm_m: loaded by this modprobe (it was not loaded before); which build is $kmm_detail" ;;
        esac
    done
}
"""


def normalized(name: str) -> str:
    """A module name as the kernel shows it (``/sys/module``): kmod's ``-`` is ``_``."""
    return name.replace("-", "_")


def _call(*words: str) -> str:
    return shlex.join(words)


def _compact(script: str) -> str:
    """``script`` without its comment lines and indentation: it is in every
    loader pod's spec (this source keeps both; no line of it continues a
    quoted string, so none changes meaning)."""
    lines = (line.strip() for line in script.splitlines())
    return "".join(line + "\n" for line in lines if line and not line.startswith("#"))


def _reporting() -> str:
    return _compact(_REPORTING.replace("@REPORT@", REPORT_PATH))


def load_script(
    *,
    in_tree: Sequence[str],
    firmware: Sequence[str] | None,
    load: Sequence[str],
    checked: tuple[str, str] | None,
) -> str:
    """The ``postStart`` script: remove ``in_tree``, run ``firmware`` (the
    copy) and ``load`` (a ``modprobe`` command), checking the kernel before
    and after the load when ``checked`` names the module (dirName, moduleName)."""
    lines = [_reporting() + _compact(_KERNEL + loader_buildids.LIBRARY + _STEPS).rstrip("\n")]
    if checked is not None:
        dir_name, name = checked
        lines.append(_call("kmm_probe", dir_name, name, normalized(name)))
    else:
        lines.append("kmm_list=")
    if in_tree:
        lines.append(_call("kmm_remove_in_tree", *(normalized(n) for n in in_tree)))
    if firmware:
        lines.append(_call("kmm_run", shlex.join(firmware), *firmware))
    if checked is not None:
        lines.append("kmm_unload_stale")
    else:
        lines.append(
            _call(
                "kmm_log",
                "rawArgs: which module they load is not kmm's to know, so neither what "
                "the kernel held before nor what it holds after is checked",
            )
        )
    lines.append(_call("kmm_run", shlex.join(load), *load))
    if checked is not None:
        lines.append("kmm_verify")
    return "\n".join(lines) + "\n"


def unload_script(unload: Sequence[Sequence[str]]) -> str:
    """The ``preStop`` script: the ``unload`` commands in order, the first
    failure reported."""
    lines = [_reporting().rstrip("\n")]
    lines.extend(_call("kmm_run", shlex.join(command), *command) for command in unload)
    return "\n".join(lines) + "\n"
