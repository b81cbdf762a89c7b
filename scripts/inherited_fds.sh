# Sourced by the scripts that run mmdebstrap.
#
# mmdebstrap hands apt one of its pipes by number, as `sh -c 'cat >&N'`, and
# Debian's sh (dash) refuses a number above 9 ("Bad fd number": the build
# fails). Descriptors a caller leaves open (make's jobserver, a flock's lock,
# a CI runner's own) push N there, so mmdebstrap runs with only 0, 1 and 2.

without_inherited_fds() {
    (
        for fd in $(ls "/proc/$BASHPID/fd"); do
            if [ "$fd" -gt 2 ]; then
                eval "exec $fd>&-"
            fi
        done
        exec "$@"
    )
}
