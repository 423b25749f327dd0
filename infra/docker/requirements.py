"""Print the requirements of loraplex's core and of the given extras, one a line, read from pyproject.toml:
`python3 requirements.py pyproject.toml trainer > req.txt`.

infra/docker/Dockerfile installs them in a layer that only pyproject.toml (and this file) key, before it
copies the sources, then installs loraplex itself with `pip install --no-deps`: a source change rebuilds
that small last layer, not the gigabytes of dependencies. Extras that name loraplex's own extras
(`loraplex[model]`) are expanded here; the build backend's requirements come too (the last step builds
without isolation, offline). Standard library only: it runs in the bare image before anything is installed.
"""

import re
import sys
import tomllib


def requirements(pyproject: dict, extras: list[str]) -> list[str]:
    project = pyproject["project"]
    optional = project.get("optional-dependencies", {})
    own = re.compile(rf"^{re.escape(project['name'])}\[([^\]]+)\]$")
    out = list(pyproject.get("build-system", {}).get("requires", [])) + list(project.get("dependencies", []))
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop(0).strip()
        if not extra or extra in seen:
            continue
        if extra not in optional:
            raise SystemExit(f"{project['name']} has no extra {extra!r}")
        seen.add(extra)
        for requirement in optional[extra]:
            match = own.match(requirement.replace(" ", ""))
            if match:
                todo.extend(match.group(1).split(","))
            else:
                out.append(requirement)
    return list(dict.fromkeys(out))  # first occurrence wins, order kept


def main() -> None:
    with open(sys.argv[1], "rb") as file:
        pyproject = tomllib.load(file)
    extras = [extra for arg in sys.argv[2:] for extra in arg.split(",")]
    print("\n".join(requirements(pyproject, extras)))


if __name__ == "__main__":
    main()
