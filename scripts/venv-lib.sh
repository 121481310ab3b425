# venv-lib.sh — sourced by the scripts that keep a virtualenv of PyPI
# packages (install-py-deps.sh, install-hf-venv.sh): the steps they share.
# Each caller sets `tag` (its name in messages) and `venv` (the path),
# then calls venv_args; that sets `py` and `mode`.

# Debian's interpreter by its path (a python3 earlier on PATH, pyenv's,
# may lack the venv module or differ from the one the tests use), and
# the arguments: none (install), --check, or --help (prints lines $1..$2
# of the calling script's header).
venv_args() {
  local from=$1 to=$2
  shift 2
  py=/usr/bin/python3
  [[ -x $py ]] || py=$(command -v python3 || true)
  mode=install
  case "${1:-}" in
    "") ;;
    --check) mode=check ;;
    -h | --help) sed -n "${from},${to}p" "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$tag: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
}

# Exits 0 when the installed state ($1) is the wanted one ($2), and in
# check mode exits 1 saying what is missing; otherwise returns, to install.
venv_done_or_check() {
  local have=$1 want=$2
  if [[ $have == "$want" ]]; then
    echo "$tag: $venv has $want"
    exit 0
  fi
  if [[ $mode == check ]]; then
    echo "$tag: $venv lacks $want${have:+ (has $have)}" >&2
    exit 1
  fi
}

# Creates $venv with $py unless it exists; exits 1 naming the Debian
# package to install when it cannot.
venv_create() {
  if [[ -z $py ]]; then
    echo "$tag: python3 not found (Debian package python3)" >&2
    exit 1
  fi
  if [[ ! -x $venv/bin/python ]]; then
    echo "$tag: $py -m venv $venv"
    if ! "$py" -m venv "$venv"; then
      rm -rf "$venv"
      echo "$tag: '$py -m venv' failed: install the Debian package python3-venv" >&2
      exit 1
    fi
  fi
}
