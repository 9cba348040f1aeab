_jepa_completion() {
    local IFS=$'\n'
    local response words=() cword=0 i

    for ((i = 0; i < ${#COMP_WORDS[@]}; i++)); do
        if ((i > 0)) && [[ ${COMP_WORDS[i]} == ':' || ${words[${#words[@]}-1]} == *: ]]; then
            words[${#words[@]}-1]+=${COMP_WORDS[i]}
        else
            words+=("${COMP_WORDS[i]}")
        fi
        ((i == COMP_CWORD)) && cword=$((${#words[@]} - 1))
    done
    local cur=${words[cword]} prefix=''
    [[ $COMP_WORDBREAKS == *:* && $cur == *:* ]] && prefix=${cur%"${cur##*:}"}

    response=$(env COMP_WORDS="${words[*]}" COMP_CWORD=$cword _JEPA_COMPLETE=bash_complete $1)

    for completion in $response; do
        IFS=',' read type value <<< "$completion"

        if [[ $type == 'dir' ]]; then
            COMPREPLY=()
            compopt -o dirnames
        elif [[ $type == 'file' ]]; then
            COMPREPLY=()
            compopt -o default
        elif [[ $type == 'plain' ]]; then
            COMPREPLY+=("${value#"$prefix"}")
        fi
    done

    return 0
}

_jepa_completion_setup() {
    complete -o nosort -F _jepa_completion jepa
}

_jepa_completion_setup;
