"""The VM node image's recipe and key."""

from __future__ import annotations

from pathlib import Path

from kmm.sandbox.vmnodes import images, kernels, toolkits

CHOSEN = kernels.KernelList(versions=("6.1.0-57-amd64", "6.12.118+deb12-amd64"))


def test_the_image_holds_both_kernels_and_what_a_node_runs() -> None:
    argv = images.mmdebstrap_argv(CHOSEN, Path("/tree"), Path("/guest"))
    included = next(a for a in argv if a.startswith("--include=")).split("=", 1)[1].split(",")
    assert {"linux-image-6.1.0-57-amd64", "linux-image-6.12.118+deb12-amd64"} <= set(included)
    assert {"systemd", "kmod", "iptables", "conntrack", "qemu-guest-agent"} <= set(included)
    assert argv[-4:] == ["/tree", *kernels.sources()]
    # Small initrds, configured before the kernels install.
    assert any("MODULES=list" in a for a in argv if a.startswith("--essential-hook="))
    # Signed boot files fetched, never installed.
    customize = next(a for a in argv if a.startswith("--customize-hook="))
    assert "apt-get download shim-signed grub-efi-amd64-signed" in customize
    baked = {name for _, _, names in images.BINARIES for name in names}
    assert {"kubelet", "kube-proxy", "containerd", "runc", "bridge", "host-local"} <= baked


def test_the_kernel_list_keys_the_image_and_the_toolkits() -> None:
    other = kernels.KernelList(versions=("6.1.0-58-amd64", "6.12.118+deb12-amd64"))
    assert images.image_key(CHOSEN) != images.image_key(other)
    assert images.image_key(CHOSEN) == images.image_key(CHOSEN)
    kernel = "6.12.118+deb12-amd64"
    assert toolkits.toolkit_key(CHOSEN, kernel) != toolkits.toolkit_key(other, kernel)


def test_a_toolkit_has_its_kernels_headers() -> None:
    argv = toolkits.mmdebstrap_argv(CHOSEN, "6.12.118+deb12-amd64", Path("/o.tar"), Path("/h"))
    assert '--customize-hook=/h "$1" 6.12.118+deb12-amd64' in argv
    assert argv[-4] == "/o.tar"
