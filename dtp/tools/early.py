"""The checks of `dtp run` / `dtp serve` arguments that need neither torch nor diffusers, run before either loads.

A command's module imports torch and diffusers (~4-5 CPU s a process; under torchrun once per rank) before it
looks at its arguments. A mistake these checks can see from the arguments and the file system alone (a
`--model-dir` that is no pipeline folder, a `--prompts` / `--image` / `--lora` file that is not there, an option
combination the command refuses, a count below 1) is refused here instead, with the message and exit code the
command would give later (`failure.report_early`). What needs the libraries (the transformer class diffusers must
know, an image PIL must read) is still checked by the command. Imports only the standard library and `dtp.errors`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import CheckpointError, PlanError

STANDARD_INDEX = "model_index.json"  # as `dtp.pipeline.modular`, which imports diffusers' world with its package
MODULAR_INDEX = "modular_model_index.json"
TRANSFORMER = "transformer"
LOAD_COMMANDS = ("run", "serve")
LORA_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt")  # a weights file, never a Hub id


def check_arguments(args) -> None:
    """PlanError for the first mistake in `args` that is visible without torch (see the module docstring)."""
    if args.command not in LOAD_COMMANDS:
        return
    check_model_dir(args.model_dir)
    check_load_counts(args)
    if args.cache_threshold is not None and args.cache is None:
        raise PlanError("--cache-threshold needs --cache NAME.")
    check_lora_files(args.lora)
    pipeline_args(args.pipeline_arg)
    if args.command == "run":
        _check_run_files(args)
    else:
        _check_serve_counts(args)


def check_model_dir(model_dir) -> None:
    """The folder holds a pipeline index naming a transformer; the same CheckpointError text as
    `dtp.pipeline.load._model_index` / `transformer_class`."""
    folder = Path(model_dir)
    standard, modular = folder / STANDARD_INDEX, folder / MODULAR_INDEX
    path = standard if standard.is_file() or not modular.is_file() else modular
    if not path.is_file():
        found = "does not exist" if not folder.exists() else f"has no {path.name}"
        raise CheckpointError(
            f"--model-dir {model_dir} {found}; pass a diffusers pipeline folder (the one holding model_index.json, "
            f"e.g. downloaded with huggingface_hub.snapshot_download)."
        )
    try:
        entry = json.loads(path.read_text()).get(TRANSFORMER)
    except (OSError, ValueError, AttributeError):
        return  # unreadable or not a JSON object: the command's own reading says how
    if not entry or not isinstance(entry, list) or len(entry) < 2 or entry[1] is None:
        raise CheckpointError(
            f"{standard} names no diffusers transformer component ({entry!r}); dtp shards a pipeline's transformer."
        )


def check_load_counts(args) -> None:
    """--cp, --cfg and --ulysses at least 1 (argparse took them as integers of any sign), as `policy.check_degree`
    words it; whether U divides cp is `policy.ulysses_degree`'s to say (with the divisors)."""
    for flag in ("cp", "cfg", "ulysses"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise PlanError(f"--{flag} must be a positive integer, got {value!r}.")


def check_lora_files(values: list[str] | None) -> None:
    """Every `--lora [NAME=]PATH` that can only be a local path exists (the syntax: `pipeline.session.parse_loras`).
    diffusers' `lora_state_dict` also takes a Hub id (`owner/name`, no file suffix), checked only when loading."""
    for value in values or []:
        name, sep, path = value.partition("=")
        path = path if sep else value
        if path and _local_only(path) and not os.path.exists(path):
            raise PlanError(f"--lora {value}: {path} does not exist; pass a diffusers LoRA file or folder.")


def _local_only(path: str) -> bool:
    """`path` cannot be a Hub repository id: absolute, relative to . or ~, deeper than owner/name, or a file."""
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1 or path.endswith(LORA_SUFFIXES)


def pipeline_args(values: list[str] | None) -> dict:
    """{key: value} of repeated `--pipeline-arg KEY=JSON` (a value that is not JSON is taken as a string)."""
    found = {}
    for value in values or []:
        key, sep, text = value.partition("=")
        if not sep or not key.isidentifier():
            raise PlanError(f"--pipeline-arg {value!r}: expected KEY=VALUE, e.g. max_sequence_length=64.")
        try:
            found[key] = json.loads(text)
        except json.JSONDecodeError:
            found[key] = text
    return found


def _check_run_files(args) -> None:
    """`--prompts` readable and `--image` there, with the command's own messages (`run._lines`, `open_image_path`);
    the counts at least 1."""
    if args.prompts is not None:
        try:
            with open(args.prompts, "rb"):
                pass
        except OSError as error:
            raise PlanError(f"--prompts {args.prompts}: cannot read it ({error.strerror}).") from None
    if args.image is not None:
        try:
            with open(args.image, "rb"):
                pass
        except OSError as error:  # what PIL's Image.open raises for it, so the same text
            raise PlanError(f"image {args.image}: cannot read it as an image ({error}).") from None
    for name in ("steps", "height", "width", "frames", "fps"):  # `request._check_counts`' words
        value = getattr(args, name)
        if value is not None and value < 1:
            raise PlanError(f"{name} must be a positive integer, got {value!r}.")


def _check_serve_counts(args) -> None:
    """`serve._check_serve_options`' checks that need no process group (same messages)."""
    if args.max_batch < 1 or args.batch_wait_ms < 0:
        raise PlanError(f"--max-batch {args.max_batch} / --batch-wait-ms {args.batch_wait_ms}: at least 1 / 0.")
    if args.replicas != 1 and "WORLD_SIZE" not in os.environ:  # `launch.under_torchrun`
        raise PlanError(f"--replicas {args.replicas}: replicas split torchrun's ranks; launch with torchrun.")
    if args.replicas > 1 and args.ulysses not in (None, 1, args.cp):
        raise PlanError(
            f"--replicas {args.replicas} with --ulysses {args.ulysses}: a replica's mesh is a plain cp axis; serve "
            f"USP without --replicas, or give each replica plain Ulysses (--ulysses {args.cp}) or ring (1)."
        )
