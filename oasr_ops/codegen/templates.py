"""The Jinja environment over templates/ and the C launcher ABI version: shared by every renderer of codegen
(render.py for the fp16/bf16 lanes, emit_int8.py for the int8 ones), so no renderer imports another."""
from __future__ import annotations

import functools

from ..paths import templates_dir

# Bumped when the C launcher's signature changes; the loader refuses a library with another version.
ABI_VERSION = 1


def environment_for(folder):
    """A Jinja environment over `folder` with the renderers' options (the A/B tools in benchmarks/ render other
    revisions of templates/ with it)."""
    import jinja2  # on the first render, not with the package

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


@functools.lru_cache(maxsize=1)
def environment():
    return environment_for(templates_dir())
