"""A Module's ``build`` and ``sign`` sections: building an image in the
cluster and signing its kernel modules for Secure Boot (KMM's).

Both appear at the container and at the kernel-mapping level; their merge
for one kernel is :func:`kmm.api.kernels.target`'s, and the rules across
the two levels (what is required of the merge) are the loader container's
(:mod:`kmm.api.moduleloader`). ``RegistryTLS`` says how kmm reaches the
registries these sections (and the loader's images) name.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import ConfigDict, Field

from kmm.api import cel, fields, formats, models

__all__ = [
    "Build",
    "BuildArg",
    "FileToSign",
    "KanikoParams",
    "RegistryTLS",
    "ResourceReference",
    "Sign",
]

# Bounds for the CEL cost estimate (see kmm.api.fields).
_MAX_FILES_TO_SIGN = 16
_MAX_FILE_TO_SIGN = 512
_MAX_BUILD_SECRETS = 16
_MAX_BUILD_ARG_NAME = 256


class RegistryTLS(models.Model):
    """How kmm reaches a registry: plain HTTP (insecure) or TLS without
    verifying the certificate (insecureSkipTLSVerify). It governs kmm's own
    registry requests (the operator's image existence checks) and the build
    and sign pods' pulls and pushes; nodes pull images as their container
    runtime's registry configuration says, as in KMM.

    An object with neither option set asks nothing (KMM's Go client writes
    ``{}`` for its unset struct).
    """

    model_config = ConfigDict(alias_generator=None)

    insecure: bool | None = None
    insecure_skip_tls_verify: bool | None = Field(default=None, alias="insecureSkipTLSVerify")

    def is_set(self) -> bool:
        """Whether an option is given (an empty object is the same as none)."""
        return self.insecure is not None or self.insecure_skip_tls_verify is not None


class ResourceReference(models.KubeModel):
    """core/v1 LocalObjectReference to a ConfigMap or Secret in the Module's
    namespace that build or sign pods read. The name must be a DNS subdomain
    (an object name; a build secret's name is also a directory, /run/secrets/<name>)."""

    name: fields.DnsSubdomain


class BuildArg(models.Model):
    """One ``--build-arg`` of the image build (KMM's BuildArg)."""

    name: Annotated[str, Field(min_length=1, max_length=_MAX_BUILD_ARG_NAME)]
    value: str


class KanikoParams(models.Model):
    """KMM's kaniko settings: accepted so KMM manifests apply; kmm builds
    with buildah, so they have no effect (admission warns)."""

    tag: str | None = None


# "$" only in a known variable, ${VAR} or $VAR (then no name character may
# follow). One match rather than the images' findAll: a Module may list
# hundreds of files across its mappings, and the apiserver budgets the cost
# of every rule by the most it could run. RE2 and Python's re (ASCII \b) read
# this pattern alike, so the same text judges in both.
_NAMES = "|".join(formats.IMAGE_VARIABLES)
_FILE_VARIABLES_PATTERN = rf"^([^$]|\$(\{{({_NAMES})\}}|({_NAMES})\b))*$"
_FILE_VARIABLES = re.compile(_FILE_VARIABLES_PATTERN, re.ASCII)
_FILE_VARIABLES_RULE = (
    f"may use '$' only in the variables {', '.join(formats.IMAGE_VARIABLES)} "
    "(as ${NAME} or $NAME)"
)


def _file_to_sign_error(path: str) -> str | None:
    if re.search(fields.PARENT_COMPONENT_PATTERN, path):
        return f"filesToSign entry {path!r} may not contain a '..' component"
    if not _FILE_VARIABLES.match(path):
        return f"filesToSign entry {path!r} {_FILE_VARIABLES_RULE}"
    return None


FileToSign = Annotated[
    str,
    Field(min_length=1, max_length=_MAX_FILE_TO_SIGN),
    fields.checked(_file_to_sign_error),
    fields.NO_PARENT_COMPONENT,
    cel.Rule(f"self.matches({_FILE_VARIABLES_PATTERN!r})", _FILE_VARIABLES_RULE),
]


class Build(models.Model):
    """``build``: build the image in the cluster when it is missing from the
    registry, from the Dockerfile in a ConfigMap (key ``dockerfile``).

    Set at the container level, a kernel mapping's ``build`` adds to it for
    that mapping's kernels (see kernels.BuildTarget for the merge);
    dockerfileConfigMap is required at one level or the other.
    """

    build_args: list[BuildArg] | None = None
    dockerfile_config_map: ResourceReference | None = None
    base_image_registry_tls: RegistryTLS | None = Field(default=None, alias="baseImageRegistryTLS")
    secrets: Annotated[list[ResourceReference], Field(max_length=_MAX_BUILD_SECRETS)] | None = None
    kaniko_params: KanikoParams | None = None
    selector: dict[str, str] | None = None


class Sign(models.Model):
    """``sign``: sign kernel modules in the image for Secure Boot with the
    key and certificate of two Secrets (keys ``key`` and ``cert``).

    Without ``build`` it signs ``unsignedImage``; with it, the image just
    built. A kernel mapping's ``sign`` adds to the container's (see
    kernels.SignTarget); keySecret, certSecret and filesToSign are required
    at one level or the other, and every filesToSign entry lies under
    modprobe.dirName.
    """

    unsigned_image: fields.Image | None = None
    unsigned_image_registry_tls: RegistryTLS | None = Field(
        default=None, alias="unsignedImageRegistryTLS"
    )
    key_secret: ResourceReference | None = None
    cert_secret: ResourceReference | None = None
    files_to_sign: (
        Annotated[list[FileToSign], Field(min_length=1, max_length=_MAX_FILES_TO_SIGN)] | None
    ) = None
