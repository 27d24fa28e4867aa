"""The config's ``outputs:`` section: where analytics events are delivered (MQTT, webhooks),
one entry per output, each validated against the options of the output its ``kind`` names
(one module each in ``streams/outputs/``)."""

from __future__ import annotations

from typing import Annotated, Union

from pydantic import AfterValidator, Field

from pipeline.config.errors import fail_at
from streams.outputs import output_options_models
from streams.outputs.base import OutputOptions

MAX_OUTPUTS = 8

#: An ``outputs:`` entry: the options of the output its ``kind`` names.
OutputSettings = Annotated[Union[output_options_models()], Field(discriminator="kind")]  # noqa: UP007


def _check_names(outputs: list[OutputOptions]) -> list[OutputOptions]:
    """Each output reads through a consumer group of its name: names must differ."""
    first: dict[str, int] = {}
    problems = []
    for index, options in enumerate(outputs):
        name = options.output_name
        if name in first:
            message = (
                f"duplicate output name {name!r} (also outputs[{first[name]}]): give each "
                "output of a kind its own name"
            )
            problems.append(((index, "name"), message, None))
        else:
            first[name] = index
    if problems:
        raise fail_at("outputs", problems)
    return outputs


#: The ``outputs:`` list (default: none; events stay in Redis only).
Outputs = Annotated[
    list[OutputSettings],
    Field(
        max_length=MAX_OUTPUTS,
        description="Where analytics events are delivered, at least once, each through its "
        "own consumer group (kinds: one per module in streams/outputs/); default: none",
    ),
    AfterValidator(_check_names),
]
