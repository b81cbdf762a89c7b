#!/bin/sh
# An mmdebstrap customize hook (scripts/build_builder_image.sh,
# scripts/build_test_images.sh): the kernel's build tools of the one kernel
# the suite's linux-headers-amd64 names today, found in the chroot at "$1",
# never a hard-coded version (Debian's point releases change it).
#   debian_kbuild.sh ROOT kbuild    linux-kbuild-<abi>, sign-file on PATH
#   debian_kbuild.sh ROOT headers   that and the headers of <abi>-amd64
# The headers package depends on its kernel image (and so on initramfs
# tools); a build needs neither: its files are unpacked without it.
set -eu
root=$1
what=$2
abi=$(chroot "$root" apt-cache depends linux-headers-amd64 |
    sed -n 's/^ *Depends: linux-headers-\(.*\)-amd64$/\1/p')
[ -n "$abi" ] || { echo "debian_kbuild: no linux-headers-<abi>-amd64 behind linux-headers-amd64" >&2; exit 1; }
echo "debian_kbuild: kernel $abi-amd64"
case $what in
kbuild)
    chroot "$root" apt-get install --yes --no-install-recommends "linux-kbuild-$abi"
    ln -s "/usr/lib/linux-kbuild-$abi/scripts/sign-file" "$root/usr/local/bin/sign-file"
    chroot "$root" test -x /usr/local/bin/sign-file
    ;;
headers)
    chroot "$root" apt-get install --yes --no-install-recommends \
        "linux-kbuild-$abi" "linux-headers-$abi-common"
    chroot "$root" sh -c "cd /tmp && apt-get download linux-headers-$abi-amd64 &&
        dpkg-deb --extract linux-headers-$abi-amd64_*.deb / && rm linux-headers-$abi-amd64_*.deb"
    chroot "$root" test -f "/usr/src/linux-headers-$abi-amd64/Makefile"
    ;;
*)
    echo "debian_kbuild: unknown $what (kbuild or headers)" >&2
    exit 2
    ;;
esac
chroot "$root" apt-get clean
