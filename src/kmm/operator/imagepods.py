"""The pods that make a Module's images sent: build, sign and pull pods, and their Events.

``Sender.send`` carries out the build planner's plan
(``build.planner.BuildPlan``): it deletes the pods the planner is done
with, creates the ones it wants (each create's Event only when the pod was
made), then tells the planner's own Events, and reports back to the build
concern (``build.concern.BuildConcern.done``) what was told.

A refused create stays local, as every refused write does: it is its
kernel's, so the plan comes back with that image failed (``SignFailed``,
``BuildFailed``, or ``Checking`` again for a pull pod) and the Module gets
the ``PodRefused`` problem, with the server's words and one Warning Event
per distinct refusal (``telling``); the other pods still go.

Limits: which pods to make is the build planner's (pure), and the
``kmm.operator.build`` package writes nothing to the API server; this
module is where its pods are written. Without a build concern wired (tests
of other concerns) nothing is sent.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kmm.api import conditions, labels, modules
from kmm.operator import failures, status, telling, views, writing
from kmm.operator.build import concern as build_concern
from kmm.operator.build import planner as build_planner

__all__ = ["Sender"]

RawObject = dict[str, Any]


class Sender:
    def __init__(self, writer: writing.Writer, teller: telling.Teller) -> None:
        self.writer = writer
        self.teller = teller

    async def send(
        self,
        raw: RawObject,
        view: views.ModuleView,
        building: build_planner.BuildPlan,
        *,
        concern: build_concern.BuildConcern | None,
    ) -> tuple[build_planner.BuildPlan, list[status.Problem]]:
        """Delete the pods the build planner is done with, create the ones it
        wants, then tell its Events (each once). A refused create is its
        kernel's: the plan comes back with that image failed, and the refusal."""
        if concern is None or not (building.concerned or building.delete):
            return building, []
        key = f"{view.namespace}/{view.name}"
        refused: list[status.Problem] = []
        for pod in building.delete:
            name = pod["metadata"]["name"]
            with failures.step(f"deleting pod {name}"):
                await self.writer.delete_pod(pod)
        for creation in building.create:
            name = creation.pod["metadata"]["name"]
            try:
                with failures.step(f"creating pod {name}"):
                    created = await self.writer.create_pod(creation.pod)
            except Exception as err:
                if not failures.refused(err):
                    raise
                message = f"the API server refused pod {name}: {failures.refusal(err)}"
                refused.append(status.Problem(conditions.REASON_POD_REFUSED, message))
                building = _image_refused(building, creation.pod, message)
                await self.teller.tell(
                    raw, key, f"Pod/{name}", conditions.REASON_POD_REFUSED, message
                )
                continue
            self.teller.settled(key, f"Pod/{name}")
            if created:
                event = creation.event
                await self.teller.event(raw, event.type, event.reason, event.message)
        for event in building.events:
            await self.teller.event(raw, event.type, event.reason, event.message)
        concern.done(view, building)
        return building, refused


def _image_refused(
    building: build_planner.BuildPlan, pod: RawObject, message: str
) -> build_planner.BuildPlan:
    """``building`` with the image the refused ``pod`` was to make failed."""
    name = pod["metadata"]["name"]
    role = views.role(pod)
    failed: modules.ImageState = (
        "SignFailed"
        if role == "sign"
        else "Checking"
        if role == labels.PULL_ROLE
        else "BuildFailed"
    )
    images = [
        image.model_copy(update={"state": failed, "pod": None, "message": message})
        if image.pod == name
        else image
        for image in building.images
    ]
    return dataclasses.replace(building, images=images)
