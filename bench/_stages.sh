# Sourced by bench/*_levers.sh: the stages asked for (default: all), each checked before any
# runs, and the results folder ($OUT, the device tool's, or bench/results/).
pick_stages() {  # all stages, then the script's arguments: sets $stages and $out
    local all=$1 s
    shift
    stages=${*:-$all}
    for s in $stages; do
        case " $all " in
            *" $s "*) ;;
            *) echo "$(basename "$0"): unknown stage '$s' ($all)" >&2
               exit 2 ;;
        esac
    done
    out=${OUT:-bench/results}
    mkdir -p "$out"
}
