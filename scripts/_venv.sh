# Sourced by scripts/test and scripts/demo: ./.venv with the package and its dev extras installed.
# Reinstalls only when the packaging files change (a stamp file remembers their hash).
ensure_venv() {
  local venv=.venv
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
  fi
  local stamp="$venv/.installed-$(cat setup.cfg pyproject.toml | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -e ".[dev]"
    rm -f "$venv"/.installed-*
    touch "$stamp"
  fi
  PYTHON="$venv/bin/python"
}
