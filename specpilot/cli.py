"""Shared command-line plumbing for the Hydra entry points in scripts/: a user error (bad config key,
checkpoint or prompt) is one line on stderr and exit code 2; anything else keeps its traceback."""

from __future__ import annotations

import os
import sys

# Hydra prints its own errors (a bad override, a missing group option) over several lines and exits 1;
# with HYDRA_FULL_ERROR it raises them instead, and `run_cli` turns them into one line and exit 2. A user
# who set HYDRA_FULL_ERROR themselves gets Hydra's traceback as asked. Set only when a script runs (not on
# import), so importing a script in-process leaves the environment alone.

EXIT_USER_ERROR = 2


def one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def fail(message: str) -> None:
    print(one_line(message), file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def _user_error(e: Exception) -> str | None:
    """The one-line message for an error the user can fix, else None (a bug: keep the traceback)."""
    from specpilot.config import ConfigError
    from specpilot.models.config import CheckpointError

    if isinstance(e, ConfigError):
        return str(e)
    if isinstance(e, CheckpointError):
        return f"checkpoint error: {e}"
    common = sys.modules.get("specpilot.decoding.common")  # loaded by then if a PromptError can exist
    if common is not None and isinstance(e, common.PromptError):
        return f"prompt error: {e}"
    return None


def _hydra_error(e: Exception) -> str:
    from hydra.errors import MissingConfigException, OverrideParseException

    from specpilot.config import is_known_key

    if isinstance(e, MissingConfigException) and e.missing_cfg_file and e.options:
        group, _, option = e.missing_cfg_file.rpartition("/")
        return f"config error: {group or option}: no option {option!r} (available: {', '.join(e.options)})"
    if isinstance(e, OverrideParseException):
        key, sep, value = str(e.override).partition("=")
        hint = (f"; quote the value inside the argument: '{key}=\"{value}\"'"
                if sep and value and value[0] not in "[{" and "'" not in e.override and '"' not in value else "")
        return f"config error: cannot parse override {e.override!r}: {one_line(e.message)}{hint}"
    key = getattr(e.__cause__, "full_key", None)
    if key and "not in struct" in str(e.__cause__):
        if is_known_key(key):
            return f"config error: {key}: not set in conf/; add it with +{key}=VALUE"
        return f"config error: {key}: unknown key"
    return f"config error: {one_line(e)}"



def run_cli(hydra_main) -> None:
    """Call a `@hydra.main` function, turning user errors (ours or Hydra's) into one line + exit 2."""
    from hydra.errors import HydraException

    user_full_error = "HYDRA_FULL_ERROR" in os.environ
    os.environ.setdefault("HYDRA_FULL_ERROR", "1")
    try:
        hydra_main()
    except HydraException as e:
        if user_full_error:
            raise
        fail(_hydra_error(e))


def scrub_hydra_files() -> None:
    """Redact secrets in what Hydra saved under `<run dir>/.hydra` (the composed config, the overrides) before any
    of our checks ran: a key given as an override (`+search.gemini.api_key=...`) must not stay on disk."""
    from pathlib import Path

    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from specpilot.tracking import scrub

    if not HydraConfig.initialized() or not HydraConfig.get().output_subdir:
        return
    for path in (Path(HydraConfig.get().runtime.output_dir) / HydraConfig.get().output_subdir).glob("*.yaml"):
        saved = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        clean = scrub(saved)
        if clean != saved:
            path.write_text(OmegaConf.to_yaml(OmegaConf.create(clean)))


def guarded(run, hydra_cfg) -> None:
    """Run `run(hydra_cfg)` inside a Hydra main, mapping user errors to one line + exit 2."""
    try:
        scrub_hydra_files()
        run(hydra_cfg)
    except Exception as e:
        message = _user_error(e)
        if message is None:
            raise
        fail(message)
