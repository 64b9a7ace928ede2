"""Checkpoints: safetensors tensors + JSON, verified on load, swapped in atomically.

Layout of ``RUN/checkpoints``::

    step_0000200/
        model.safetensors      full (unsharded) weights, by parameter name
        optimizer.safetensors  AdamW state: "<param>/step", "<param>/exp_avg", "<param>/exp_avg_sq"
        rng.safetensors        torch RNG states (uint8)
        meta.json              step, data position, scheduler, param groups, config, shapes, SHA-256 of the files
    latest.json                {"checkpoint": "step_0000200", "meta_sha256": ...}

Nothing here unpickles anything: tensors come from safetensors, the rest from JSON.

Atomicity: a checkpoint is written into a temporary directory, flushed to disk, renamed to its
``step_*`` name, and only then does ``latest.json`` (replaced with ``os.replace``, itself atomic)
point to it. A crash at any moment leaves ``latest.json`` naming a complete checkpoint, so a failed
or killed run never damages the last good one. Older directories are pruned after the swap.

Verification on load: latest.json and meta.json must have their fields of the right types, the
SHA-256 of meta.json (recorded in latest.json) and of every tensor file (recorded in meta.json) must
match, every tensor file's header must read as safetensors with the shapes meta.json records, and
every tensor must have the shape of the model it is loaded into; anything else raises
``CheckpointError`` with one line saying what is wrong. A run reads checkpoints of its own folder
only: every file is a regular file that, symbolic links followed, lies inside the run folder (the
parent of ``checkpoints/``), so a latest.json or a ``step_*`` link pointing at another run's weights
is refused, never silently evaluated.

Temporaries: a write killed midway leaves ``.step_*.<random>.tmp`` (and ``.latest.json.*.tmp``) in
``checkpoints/``; ``remove_stale_temporaries`` deletes them when the run starts again, under the run
folder's lock (held, nobody else can be writing them).

Fallback: readers take ``newest_valid_checkpoint``, the newest checkpoint that verifies (latest.json's,
else the next older ``step_*``), with a line for each newer one that did not; a resume from an
older one renames the unusable newer ones ``corrupt-step_*`` and points latest.json back
(``recover_from``). Only when no checkpoint verifies is the run refused.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from tokenmix.core.errors import InputError, shown
from tokenmix.core.files import (
    atomic_path,
    atomic_write_json,
    check_regular_file,
    inside,
    parse_json,
    read_json,
    read_regular_bytes,
    remove_temporaries,
)
from tokenmix.core.lock import holds_lock

FORMAT_VERSION = 1
CHECKPOINT_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
CHECKPOINT_NAME = re.compile(r"step_(\d+)")
MAX_RECORD_BYTES = 1 << 16  # latest.json: three fields
MAX_META_BYTES = 64 << 20  # meta.json: a name and a shape per parameter, the optimizer's groups


class CheckpointError(InputError):
    """A checkpoint is missing, incomplete, corrupt, tampered with or from another model."""


# ------------------------------------------------------------------------------------------ writing
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> tuple[dict, dict]:
    """Unsharded model and optimizer state keyed by parameter name, on CPU (plain, DDP or FSDP model).

    A collective under FSDP: every rank must call it; only rank 0 gets the tensors.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    if optimizer is None:
        return get_model_state_dict(model, options=opts), {}
    return get_state_dict(model, optimizer, options=opts)


def save_checkpoint(
    ckpt_root: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict,
    keep: int,
    is_main: bool = True,
) -> Path | None:
    """Write checkpoint ``step`` atomically and point latest.json at it; returns its directory (rank 0).

    ``meta`` holds the JSON-able training state (data position, scheduler, config, ...).
    """
    msd, osd = full_state(model, optimizer)
    if not is_main:
        return None
    ckpt_root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:07d}"
    final = ckpt_root / name
    if final.exists():  # left by a run that died before moving latest.json to it; never the latest one
        if _latest_name(ckpt_root) == name:
            raise CheckpointError(f"refusing to overwrite the latest checkpoint {final}")
        shutil.rmtree(final)
    with atomic_path(final, folder=True) as tmp:
        # clone: tied weights share storage, which safetensors refuses to write twice
        weights = {k: v.detach().to("cpu").clone().contiguous() for k, v in msd.items()}
        save_file(weights, str(tmp / "model.safetensors"))
        opt_tensors: dict[str, torch.Tensor] = {}
        for pname, st in osd.get("state", {}).items():
            for key, val in st.items():
                t = val if isinstance(val, torch.Tensor) else torch.tensor(val)
                opt_tensors[f"{pname}/{key}"] = t.detach().to("cpu").clone().contiguous()
        save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
        rng = {"torch_cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            for i, s in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"torch_cuda_{i}"] = s
        save_file(rng, str(tmp / "rng.safetensors"))
        groups = [
            {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items()} for g in osd.get("param_groups", [])
        ]
        full_meta = {
            "format": FORMAT_VERSION,
            "step": step,
            **meta,
            "param_groups": groups,
            "shapes": {k: list(v.shape) for k, v in weights.items()},
            "files": {f: _sha256(tmp / f) for f in CHECKPOINT_FILES},
        }
        (tmp / "meta.json").write_text(json.dumps(full_meta, indent=1))
    atomic_write_json(
        ckpt_root / "latest.json",
        {"checkpoint": name, "step": step, "meta_sha256": _sha256(final / "meta.json")},
        indent=1,
    )
    _prune(ckpt_root, keep, name)
    return final


def _prune(ckpt_root: Path, keep: int, latest: str) -> None:
    dirs = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir())
    for old in dirs[:-keep] if keep > 0 else []:
        if old.name != latest:
            shutil.rmtree(old, ignore_errors=True)


def _checkpoint_temporary(name: str) -> bool:
    return CHECKPOINT_NAME.fullmatch(name) is not None or name == "latest.json"


def remove_stale_temporaries(ckpt_root: Path) -> list[str]:
    """Delete the temporaries that killed checkpoint writes left in ``ckpt_root`` (``.step_*.*.tmp``
    folders, ``.latest.json.*.tmp`` files); returns a line per removal. The caller must hold the
    run folder's lock (``core.lock.folder_lock`` of ``ckpt_root.parent``): with it held no live process
    is writing there, so every temporary is stale."""
    ckpt_root = Path(ckpt_root)
    if not holds_lock(ckpt_root.parent):
        raise RuntimeError(f"remove_stale_temporaries({ckpt_root}) needs the lock of {ckpt_root.parent}")
    if not ckpt_root.is_dir() or ckpt_root.is_symlink():
        return []
    return [
        f"removed {p.name}, left in {ckpt_root} by a checkpoint write that did not finish"
        for p in remove_temporaries(ckpt_root, _checkpoint_temporary)
    ]


# ------------------------------------------------------------------------------------------ reading
def _run_root(ckpt_root: Path) -> Path:
    """The run folder whose files a checkpoint may consist of: the parent of ``checkpoints/``."""
    return Path(ckpt_root).parent


def _regular(path: Path, root: Path, what: str, max_bytes: int | None = None) -> None:
    """``path`` is a regular file inside ``root`` (symbolic links followed), or CheckpointError."""
    try:
        check_regular_file(path, what, within=root, max_bytes=max_bytes)
    except InputError as e:
        raise CheckpointError(str(e)) from None


def read_latest(ckpt_root: Path) -> dict | None:
    """latest.json's record, its fields checked (``checkpoint``: a ``step_N`` name in ``ckpt_root``;
    ``step``: N; ``meta_sha256``: 64 hex digits); None when there is none; CheckpointError when it is
    no regular file of the run, not JSON, or of another shape."""
    ckpt_root = Path(ckpt_root)
    path = ckpt_root / "latest.json"
    if not (path.exists() or path.is_symlink()):
        return None
    try:
        rec = read_json(path, "checkpoint record", max_bytes=MAX_RECORD_BYTES, within=_run_root(ckpt_root))
    except InputError as e:
        raise CheckpointError(f"{path} is corrupt: {e}") from None
    if not isinstance(rec, dict):
        raise CheckpointError(f"{path} is corrupt: it holds {type(rec).__name__}, not a JSON object")
    name, step, sha = rec.get("checkpoint"), rec.get("step"), rec.get("meta_sha256")
    if not isinstance(name, str) or CHECKPOINT_NAME.fullmatch(name) is None:
        raise CheckpointError(
            f"{path} is corrupt: 'checkpoint' must name a step_N folder of {ckpt_root}, got {shown(name)}"
        )
    if not isinstance(step, int) or isinstance(step, bool) or step != int(name[5:]):
        raise CheckpointError(
            f"{path} is corrupt: 'step' must be the integer {int(name[5:])} of {name}, got {shown(step)}"
        )
    if not isinstance(sha, str) or re.fullmatch(r"[0-9a-f]{64}", sha) is None:
        raise CheckpointError(f"{path} is corrupt: 'meta_sha256' must be 64 hex digits, got {shown(sha)}")
    return rec


def _latest_name(ckpt_root: Path) -> str | None:
    try:
        rec = read_latest(ckpt_root)
    except CheckpointError:
        return None
    return rec["checkpoint"] if rec is not None else None


def latest_checkpoint(ckpt_root: Path) -> Path | None:
    """Directory named by latest.json, or None when there is no checkpoint yet."""
    rec = read_latest(ckpt_root)
    return Path(ckpt_root) / rec["checkpoint"] if rec is not None else None


def _step_of(path: Path) -> int | None:
    m = CHECKPOINT_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else None


def newest_valid_checkpoint(ckpt_root: Path) -> tuple[Path | None, dict | None, list[str]]:
    """The newest checkpoint that verifies, its meta, and one line per newer one that does not.

    Tried in order: the one latest.json names, then the other ``step_*`` directories from the
    newest down (those older than latest.json's, when it names one). Returns ``(None, None, [])``
    when there is no checkpoint at all; raises ``CheckpointError`` when there are some but none is
    valid. A corrupt latest.json counts as an unusable newest checkpoint.
    """
    ckpt_root = Path(ckpt_root)
    skipped: list[str] = []
    dirs = sorted(
        (p for p in ckpt_root.glob("step_*") if p.is_dir() and _step_of(p) is not None), key=_step_of, reverse=True
    )
    candidates = dirs
    latest_path = ckpt_root / "latest.json"
    if latest_path.exists() or latest_path.is_symlink():
        try:
            latest = latest_checkpoint(ckpt_root)
        except CheckpointError as e:
            skipped.append(str(e))
        else:
            step = _step_of(latest)
            candidates = [latest] + [d for d in dirs if d != latest and (step is None or _step_of(d) < step)]
    elif not dirs:
        return None, None, []
    for ckpt in candidates:
        try:
            return ckpt, read_checkpoint_meta(ckpt), skipped
        except CheckpointError as e:
            skipped.append(str(e))
    raise CheckpointError(
        f"no valid checkpoint in {ckpt_root}: {skipped[0] if skipped else 'none found'}"
        + (f" (and {len(skipped) - 1} older one(s) unusable)" if len(skipped) > 1 else "")
    )


def recover_from(ckpt_root: Path, ckpt_dir: Path) -> list[str]:
    """Make the verified checkpoint ``ckpt_dir`` the latest again (a resume falling back to it):
    newer ``step_*`` directories are renamed ``corrupt-step_*`` (kept for inspection, never read
    again), then latest.json is pointed at ``ckpt_dir`` atomically. Returns a line per rename."""
    ckpt_root, ckpt_dir = Path(ckpt_root), Path(ckpt_dir)
    step = _step_of(ckpt_dir)
    notes = []
    for bad in sorted(
        p
        for p in ckpt_root.glob("step_*")
        if p.is_dir() and p != ckpt_dir and _step_of(p) is not None and step is not None and _step_of(p) > step
    ):
        aside = bad.with_name(f"corrupt-{bad.name}")
        shutil.rmtree(aside, ignore_errors=True)
        bad.rename(aside)
        notes.append(f"moved the unusable checkpoint {bad.name} aside to {aside.name}")
    meta = read_json(
        ckpt_dir / "meta.json", "checkpoint metadata", max_bytes=MAX_META_BYTES, within=_run_root(ckpt_root)
    )  # verified by the caller
    atomic_write_json(
        ckpt_root / "latest.json",
        {"checkpoint": ckpt_dir.name, "step": meta["step"], "meta_sha256": _sha256(ckpt_dir / "meta.json")},
        indent=1,
    )
    return notes


def read_checkpoint_meta(ckpt_dir: Path) -> dict:
    """meta.json of a checkpoint after verifying its fields, every file's checksum and every tensor
    file's header (module docstring)."""
    ckpt_dir = Path(ckpt_dir)
    root = _run_root(ckpt_dir.parent)
    if not ckpt_dir.is_dir():
        raise CheckpointError(f"checkpoint directory {ckpt_dir} does not exist")
    if not inside(ckpt_dir, root):
        raise CheckpointError(
            f"checkpoint {ckpt_dir} is a symbolic link out of the run folder {root} (to "
            f"{ckpt_dir.resolve()}); a run reads only its own checkpoints"
        )
    meta_path = ckpt_dir / "meta.json"
    if not (meta_path.exists() or meta_path.is_symlink()):
        raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: meta.json is missing")
    try:  # read once: the bytes whose checksum is verified are the bytes parsed
        data = read_regular_bytes(meta_path, "checkpoint metadata", max_bytes=MAX_META_BYTES, within=root)
    except InputError as e:
        raise CheckpointError(str(e)) from None
    try:
        rec = read_latest(ckpt_dir.parent)
    except CheckpointError:
        rec = None
    if (
        rec is not None
        and rec["checkpoint"] == ckpt_dir.name
        and rec["meta_sha256"] != hashlib.sha256(data).hexdigest()
    ):
        raise CheckpointError(
            f"checkpoint {ckpt_dir}: meta.json does not match its recorded checksum (corrupt or tampered)"
        )
    try:
        meta = parse_json(data.decode("utf-8"), f"checkpoint metadata '{meta_path}'")
    except (InputError, UnicodeDecodeError) as e:
        raise CheckpointError(f"checkpoint {ckpt_dir}: meta.json is corrupt ({e})") from None
    _check_meta(ckpt_dir, meta)
    files = meta["files"]
    for f in CHECKPOINT_FILES:
        p = ckpt_dir / f
        if not (p.exists() or p.is_symlink()):
            raise CheckpointError(f"checkpoint {ckpt_dir} is incomplete: {f} is missing")
        _regular(p, root, "checkpoint file")
        if _sha256(p) != files.get(f):
            raise CheckpointError(
                f"checkpoint {ckpt_dir}: {f} does not match its recorded checksum (truncated, corrupt or tampered)"
            )
    shapes = _tensor_shapes(ckpt_dir / "model.safetensors")
    for f in CHECKPOINT_FILES[1:]:
        _tensor_shapes(ckpt_dir / f)
    if "shapes" in meta and shapes != {k: list(v) for k, v in meta["shapes"].items()}:
        raise CheckpointError(
            f"checkpoint {ckpt_dir}: model.safetensors holds other tensors than meta.json records (corrupt or tampered)"
        )
    return meta


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_meta(ckpt_dir: Path, meta) -> None:
    """The fields of meta.json that loading reads, of the types ``save_checkpoint`` writes."""

    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {ckpt_dir}: meta.json is corrupt ({why})")

    if not isinstance(meta, dict):
        raise bad(f"it holds {type(meta).__name__}, not a JSON object")
    if meta.get("format") != FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {ckpt_dir} has format {shown(meta.get('format'))}, expected {FORMAT_VERSION}"
        )
    step = meta.get("step")
    if not _is_int(step) or step < 0:
        raise bad(f"'step' must be a non-negative integer, got {shown(step)}")
    if _step_of(ckpt_dir) is not None and _step_of(ckpt_dir) != step:
        raise bad(f"'step' is {step} in the folder of step {_step_of(ckpt_dir)}")
    files = meta.get("files")
    if not isinstance(files, dict) or not all(isinstance(files.get(f), str) for f in CHECKPOINT_FILES):
        raise bad(f"'files' must map {', '.join(CHECKPOINT_FILES)} to their SHA-256")
    groups = meta.get("param_groups")
    if not isinstance(groups, list) or not all(
        isinstance(g, dict) and isinstance(g.get("params", []), list) for g in groups
    ):
        raise bad("'param_groups' must be a list of JSON objects")
    shapes = meta.get("shapes", {})
    if not isinstance(shapes, dict) or not all(
        isinstance(v, list) and all(_is_int(d) and d >= 0 for d in v) for v in shapes.values()
    ):
        raise bad("'shapes' must map parameter names to lists of sizes")
    if "tokens" in meta and not (_is_int(meta["tokens"]) and meta["tokens"] >= 0):
        raise bad(f"'tokens' must be a non-negative integer, got {shown(meta['tokens'])}")
    pos = meta.get("data_position", {"epoch": 0, "cursor": 0})
    if not isinstance(pos, dict) or not all(_is_int(pos.get(k)) and pos[k] >= 0 for k in ("epoch", "cursor")):
        raise bad(f"'data_position' must hold non-negative integers epoch and cursor, got {shown(pos)}")


def _tensor_shapes(path: Path) -> dict[str, list[int]]:
    """Names and shapes of a safetensors file from its header (no tensor is read); CheckpointError
    when the header does not read, so that the next older checkpoint is taken instead."""
    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            return {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise CheckpointError(f"{path} is unreadable ({why})") from None


def _load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointError(
            f"{path} is unreadable ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
        ) from None


def _check_shapes(ckpt_dir: Path, weights: dict[str, torch.Tensor], model: nn.Module) -> None:
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        what = (
            (f"missing {missing[:3]}" if missing else "")
            + (" and " if missing and extra else "")
            + (f"unexpected {extra[:3]}" if extra else "")
        )
        raise CheckpointError(f"checkpoint {ckpt_dir} is from a different model: parameters {what}")
    for k, shape in expected.items():
        if tuple(weights[k].shape) != shape:
            raise CheckpointError(
                f"checkpoint {ckpt_dir} is from a different model shape: {k} is "
                f"{list(weights[k].shape)} there but {list(shape)} in this model"
            )


def load_model_weights(ckpt_dir: Path, model: nn.Module) -> dict:
    """Verify ``ckpt_dir`` and load its weights into an unwrapped ``model``; returns its meta."""
    meta = read_checkpoint_meta(ckpt_dir)
    weights = _load_tensors(Path(ckpt_dir) / "model.safetensors")
    _check_shapes(ckpt_dir, weights, model)
    model.load_state_dict(weights, strict=True)
    return meta


def load_training_state(
    ckpt_dir: Path, model: nn.Module, optimizer: torch.optim.Optimizer, unwrapped: nn.Module
) -> dict:
    """Restore weights, optimizer state and RNG into a (possibly DDP/FSDP-wrapped) model; returns meta.

    Every rank reads the files (they are small next to the model's memory) and loads the full state.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    meta = read_checkpoint_meta(ckpt_dir)
    ckpt_dir = Path(ckpt_dir)
    weights = _load_tensors(ckpt_dir / "model.safetensors")
    _check_shapes(ckpt_dir, weights, unwrapped)
    flat = _load_tensors(ckpt_dir / "optimizer.safetensors")
    state: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        pname, _, field = key.rpartition("/")
        state.setdefault(pname, {})[field] = t
    groups = []
    for g in meta["param_groups"]:
        g = dict(g)
        if "betas" in g:
            g["betas"] = tuple(g["betas"])
        groups.append(g)
    known = {name for g in groups for name in g.get("params", [])}
    if set(state) - known:
        raise CheckpointError(f"checkpoint {ckpt_dir}: optimizer state names parameters that no group holds")
    for pname, st in state.items():
        if pname in weights and "exp_avg" in st and tuple(st["exp_avg"].shape) != tuple(weights[pname].shape):
            raise CheckpointError(f"checkpoint {ckpt_dir}: optimizer state of {pname} has the wrong shape")
    try:
        set_state_dict(
            model,
            optimizer,
            model_state_dict=weights,
            optim_state_dict={"state": state, "param_groups": groups},
            options=StateDictOptions(full_state_dict=True),
        )
    except (RuntimeError, KeyError, ValueError) as e:
        raise CheckpointError(
            f"checkpoint {ckpt_dir} does not fit this model/optimizer: "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    rng = _load_tensors(ckpt_dir / "rng.safetensors")
    torch.set_rng_state(rng["torch_cpu"])
    if torch.cuda.is_available():
        cuda_states = [rng[k] for k in sorted(k for k in rng if k.startswith("torch_cuda_"))]
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda_states)
    return meta
