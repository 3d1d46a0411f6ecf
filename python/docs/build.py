"""Builds the Python API reference of `corefarm` from its docstrings with
pdoc, and checks that it is complete.

    python3 python/docs/build.py [OUT]     # default OUT: target/python-docs

Fails (exit status 1) when pdoc warns about anything, or when a public name
has no docstring: every name in `corefarm.__all__` and `corefarm.aio.__all__`,
and every public method and property of the classes among them. It documents
the `corefarm` that Python imports — the installed package (`python/build.sh`)
— so build that first.
"""

import pathlib
import sys
import warnings

import pdoc
import pdoc.doc

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULES = ("corefarm", "corefarm.aio")


def _modules():
    import corefarm
    import corefarm.aio

    return {"corefarm": corefarm, "corefarm.aio": corefarm.aio}


def _is_ours(member, package):
    """Defined by the package (its Python code or its Rust extension), not
    inherited from a built-in such as Exception or ValueError."""
    return member.taken_from[0].split(".")[0] == package


def missing_docstrings(modules=None):
    """Public names without a docstring, as sorted "module.name" strings.
    `modules`: {name: module}, by default corefarm and corefarm.aio."""
    missing = []
    for name, module in (modules or _modules()).items():
        package = name.split(".")[0]
        doc = pdoc.doc.Module(module)
        for public in module.__all__:
            member = doc.get(public)
            if member is None:
                missing.append(f"{name}.{public} (in __all__ but not found)")
                continue
            if not member.docstring.strip():
                missing.append(f"{name}.{public}")
            if isinstance(member, pdoc.doc.Class):
                for m in member.members.values():
                    if m.name.startswith("_") or not _is_ours(m, package):
                        continue
                    if not m.docstring.strip():
                        missing.append(f"{name}.{public}.{m.name}")
    return sorted(set(missing))


def build(out):
    """Writes the HTML reference into `out`; returns pdoc's warnings."""
    pdoc.render.configure(docformat="markdown", search=True, show_source=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*MODULES, output_directory=pathlib.Path(out))
    return [str(w.message) for w in caught]


def main(argv):
    out = pathlib.Path(argv[1]) if len(argv) > 1 else ROOT / "target" / "python-docs"
    import corefarm

    print(f"documenting corefarm from {corefarm.__file__}", file=sys.stderr)
    problems = [f"pdoc: {w}" for w in build(out)]
    problems += [f"no docstring: {n}" for n in missing_docstrings()]
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        return 1
    print(f"Python API reference: {out / 'corefarm.html'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
