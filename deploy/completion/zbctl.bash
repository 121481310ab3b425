# bash completion for zbctl (installed to share/bash-completion/completions).
# Commands, then each command's flags; schedule names after --schedule and
# files after the flags that take one. tests/service/test_install.py checks
# that every flag a command's --help names is offered here.
_zbctl() {
  local cur prev words cword
  _init_completion 2>/dev/null || {
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD - 1]}
    words=("${COMP_WORDS[@]}")
    cword=$COMP_CWORD
  }
  local commands="plan submit list get watch cancel resume update-schedule trace workers"
  local remote="--coordinator --output -o --timeout-ms --tls-ca --tls-cert --tls-key --help"
  local schedules="gpipe 1f1b interleaved-1f1b zb-h1 zb-h2 zb-auto zb-v v-half v-min zb-interleaved dualpipe-v"
  case $prev in
    --schedule) mapfile -t COMPREPLY < <(compgen -W "$schedules" -- "$cur"); return ;;
    --output | -o)
      case ${words[1]} in
        plan) mapfile -t COMPREPLY < <(compgen -W "ascii json csv csv-comm trace svg table" -- "$cur") ;;
        trace) mapfile -t COMPREPLY < <(compgen -W "trace svg" -- "$cur") ;;
        *) mapfile -t COMPREPLY < <(compgen -W "text json" -- "$cur") ;;
      esac
      return
      ;;
    --placement) mapfile -t COMPREPLY < <(compgen -W "loop v" -- "$cur"); return ;;
    --from-csv | --output-file | --tls-ca | --tls-cert | --tls-key) mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
  esac
  if ((cword == 1)); then
    mapfile -t COMPREPLY < <(compgen -W "$commands --help --version" -- "$cur")
    return
  fi
  local flags
  case ${words[1]} in
    plan)
      if [[ ${words[2]} == compare ]]; then
        flags="--chunks --costs --format --help --mem --mem-limit --microbatches --objective --output -o
               --output-file --ranks"
      else
        flags="compare --chunks --coordinator --costs --format --from-csv --help --mem --mem-limit --microbatches
               --objective --output -o --output-file --placement --ranks --remote --schedule --stage-costs --width"
      fi
      ;;
    submit | list | get | resume | workers) flags=$remote ;;
    watch) flags="$remote --every" ;;
    cancel) flags="$remote --reason" ;;
    update-schedule) flags="$remote --chunks --mem-limit --schedule" ;;
    trace) flags="--chunks --coordinator --format --help --iteration --mem-limit --output -o --output-file
                  --timeout-ms" ;;
    *) return ;;
  esac
  if [[ ${words[1]} == submit && $cur != -* ]]; then
    mapfile -t COMPREPLY < <(compgen -f -- "$cur")
    return
  fi
  mapfile -t COMPREPLY < <(compgen -W "$flags" -- "$cur")
}
complete -F _zbctl zbctl
