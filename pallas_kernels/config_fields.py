"""``FIELD=VALUE,...`` command-line text -> the fields of a kernel's frozen TuningConfig dataclass (``w12``,
``skinny_matmul``): what ``bench_roofline.py --w12-config / --skinny-config`` and the probes' ``--config`` take."""

from __future__ import annotations

import dataclasses


def parse_fields(text: str, config_type: type) -> dict:
  """``FIELD=VALUE,...`` -> {field: value} of ``config_type``: integers, ``True`` / ``False``, strings. ValueError
  naming the item and what it takes; the caller builds (and so checks) the config."""
  types = {f.name: str(f.type) for f in dataclasses.fields(config_type)}
  fields = {}
  for item in filter(None, text.split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in types:
      raise ValueError(f"{item!r} is not FIELD=VALUE with a {config_type.__name__} field ({', '.join(types)})")
    if types[key] == "bool":
      if value not in ("True", "False"):
        raise ValueError(f"{key} takes True or False, got {value!r}")
      fields[key] = value == "True"
    elif types[key] == "int":
      if not value.isdigit():
        raise ValueError(f"{key} takes an integer, got {value!r}")
      fields[key] = int(value)
    else:
      fields[key] = value
  return fields
