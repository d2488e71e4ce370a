"""`llamaspec info MODEL`: what a GGUF file holds (architecture, size, context, MTP layers, chat
template, special tokens) and what this build can run it on."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from . import __version__, backends
from ._flags import add_model_arguments, model_path
from ._terminal import LoadBar
from .model import Model


def add_info_arguments(p: argparse.ArgumentParser) -> None:
    """The options of `llamaspec info`."""
    add_model_arguments(p, "to describe")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--template-lines", type=int, default=8, help="lines of the chat template to show (default 8; 0: all)"
    )
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks on errors")


def _token(model: Model, t: int | None) -> dict[str, Any] | None:
    if t is None:
        return None
    return {"id": t, "text": model.token_to_piece(t, special=True).decode("utf-8", "replace")}


def describe(model: Model) -> dict[str, Any]:
    """The facts `info` prints, as a JSON-ready dict."""
    eog = [t for t in range(model.n_vocab) if model.is_eog(t)]
    regs = backends()
    return {
        "path": model.path,
        "architecture": model.architecture,
        "description": model.description,
        "n_params": model.n_params,
        "size_bytes": model.size,
        "n_ctx_train": model.n_ctx_train,
        "n_embd": model.n_embd,
        "n_layer": model.n_layer,
        "n_layer_mtp": model.n_layer_nextn,
        "n_vocab": model.n_vocab,
        "default_drafter": "mtp" if model.has_mtp else None,
        "chat_template": model.chat_template,
        "special_tokens": {
            "bos": _token(model, model.bos),
            "eos": _token(model, model.eos),
            "end_of_generation": [_token(model, t) for t in eog],
        },
        "build": {
            "llamaspec": __version__,
            "backends": {name: [{"name": n, "description": desc, "kind": kind} for n, desc, kind in devices]
                         for name, devices in regs},
            "gpus": [f"{n} ({desc})" for _, devices in regs for n, desc, kind in devices
                     if kind in ("gpu", "igpu")],
            "rpc": any(name == "RPC" for name, _ in regs),
        },
    }


def _human(n: float, unit: str) -> str:
    for prefix in ("", "K", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.1f} {prefix}{unit}" if prefix else f"{n:.0f} {unit}"
        n /= 1000
    raise AssertionError  # unreachable


def _show(t: dict[str, Any] | None) -> str:
    return "none" if t is None else f"{t['id']} {t['text']!r}"


def render(d: dict[str, Any], template_lines: int) -> str:
    """The text form of describe()'s dict."""
    mtp = d["n_layer_mtp"]
    eog = d["special_tokens"]["end_of_generation"]
    rows = [
        ("model", d["path"]),
        ("architecture", d["architecture"]),
        ("description", d["description"]),
        ("parameters", _human(d["n_params"], "")),
        ("size", _human(d["size_bytes"], "B")),
        ("context (trained)", str(d["n_ctx_train"])),
        ("layers", str(d["n_layer"]) + (f" + {mtp} MTP" if mtp else "")),
        ("embedding width", str(d["n_embd"])),
        ("vocabulary", str(d["n_vocab"])),
        ("MTP", f"yes ({mtp} layer{'s' if mtp > 1 else ''}): run/serve draft with it by default"
         if mtp else "no"),
        ("BOS", _show(d["special_tokens"]["bos"])),
        ("EOS", _show(d["special_tokens"]["eos"])),
        ("end of generation", ", ".join(_show(t) for t in eog[:8]) + (f" (+{len(eog) - 8})" if len(eog) > 8
                                                                         else "") or "none"),
        ("backends", "; ".join(f"{n}: {', '.join(dev['description'] for dev in devs) or 'no device'}"
                               for n, devs in d["build"]["backends"].items())),
        ("GPU", ", ".join(d["build"]["gpus"]) or "none (-ngl has no effect)"),
        ("RPC", "built in" if d["build"]["rpc"] else "not in this build"),
        ("llamaspec", d["build"]["llamaspec"]),
    ]
    width = max(len(k) for k, _ in rows)
    out = [f"{k:<{width}}  {v}" for k, v in rows]
    tpl = d["chat_template"]
    if tpl is None:
        out.append(f"{'chat template':<{width}}  none (run/chat send the text as it is)")
    else:
        lines = tpl.splitlines()
        shown = lines if template_lines <= 0 else lines[:template_lines]
        out.append(f"{'chat template':<{width}}  {len(lines)} lines" + (":" if shown else ""))
        out += ["    " + line for line in shown]
        if len(shown) < len(lines):
            out.append(f"    ... ({len(lines) - len(shown)} more lines; --template-lines 0 shows all)")
    return "\n".join(out)


def info(p: argparse.ArgumentParser, a: argparse.Namespace) -> int:
    """`llamaspec info`; returns the exit code."""
    path = model_path(p, a)
    with Model(path, progress=LoadBar(path)) as model:
        d = describe(model)
    if a.json:
        json.dump(d, sys.stdout, ensure_ascii=False, indent=2)
        sys.stdout.write("\n")
    else:
        print(render(d, a.template_lines))
    return 0
