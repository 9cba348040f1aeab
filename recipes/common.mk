# Included by recipes/quickstart.mk and recipes/flow-digits.mk after their variables and before their
# rules (not a recipe to run): how a recipe finds `jepa`, quotes values for the shell, refuses an OUT
# that make cannot name targets in, and makes targets depend on the values of their variables, not
# only on the files they read.
#
# Each including recipe lists names in VARS and defines VARS_<name>, the text whose change must rerun
# a target: the arguments of its command. $(OUT)/.vars-<name> holds that text. It is rewritten only
# when the text differs from what the file holds, so a target that depends on it reruns when a
# variable changed (SIZE, STEPS, SOURCE, ...) and an unchanged rerun still reruns nothing.

COMMON_HERE := $(dir $(lastword $(MAKEFILE_LIST)))
empty :=
space := $(empty) $(empty)
hash := \#

# $(call q,TEXT): TEXT as one shell word, so a SOURCE or TITLE with spaces or quotes arrives whole.
q = '$(subst ','\'',$(1))'
# $(call home,PATH): a leading ~/ as $(HOME)/, as the shell would have done to an unquoted path (zsh
# leaves the ~ of SOURCE=~/photos to the command; spaces are kept through patsubst's word split).
home = $(subst |space|, ,$(subst |home|,,$(patsubst |home|~/%,$(HOME)/%,|home|$(subst $(space),|space|,$(1)))))
# $(call flag_value,--FLAG,WORDS): the word after --FLAG in WORDS (its last occurrence), else empty.
flag_value = $(subst $(1)|,,$(lastword $(filter $(1)|%,$(join $(2),$(addprefix |,$(wordlist 2,$(words $(2)),$(2)))))))
# $(WRITE) COMMAND...: the recipe line that writes COMMAND's stdout into the target $@ through $@.tmp,
# renamed on success and removed on a failure or a signal (write-result.sh).
WRITE = sh $(call q,$(COMMON_HERE)write-result.sh) $(call q,$@)
# $(call differ,A,B): non-empty when A and B are different strings (each is empty after removing the
# other only when they are equal).
differ = $(subst $(1),,$(2))$(subst $(2),,$(1))

# JEPA: the command. `make demo` installs it in .venv, which is not on the PATH, so the recipes look
# there first: ./.venv in the current directory, then the .venv of the checkout that holds this file.
ifeq ($(origin JEPA),undefined)
JEPA_FOUND := $(firstword $(wildcard ./.venv/bin/jepa $(COMMON_HERE)../.venv/bin/jepa) \
                          $(shell command -v jepa 2>/dev/null))
# Recursive, so the error stops make only when a command is about to run: an up-to-date OUT needs no jepa.
JEPA = $(or $(JEPA_FOUND),$(error jepa not found: no ./.venv/bin/jepa and no jepa on the PATH; run `make venv` in the checkout, or set JEPA=/path/to/jepa))
endif

# Every target is a path inside OUT, and make splits target names at spaces, reads : % * ? [ ] ; \ #
# in them as syntax and expands a leading ~ where the quoted commands would not; a leading - would
# reach mkdir and jepa as an option. So OUT is refused with these rather than quoted; SOURCE may hold
# them.
OUT_SYNTAX := : % * ? [ ] ; \ $(hash)
ifeq ($(strip $(OUT)),)
$(error OUT is empty: set OUT=directory (the recipe writes its files there))
endif
ifneq ($(findstring $(space),$(OUT))$(words $(OUT))$(strip $(foreach c,$(OUT_SYNTAX),$(findstring $(c),$(OUT))))$(filter -% ~%,$(OUT)),1)
$(error OUT='$(OUT)' cannot be a make target: use a directory name without spaces or any of $(OUT_SYNTAX), not starting with - or ~)
endif
# OUT=demo/ and OUT=./demo are the same directory as OUT=demo: the same targets and the same stamps.
override OUT := $(patsubst ./%,%,$(patsubst %/,%,$(patsubst %/,%,$(OUT))))
ifeq ($(OUT),)
$(error OUT is the root directory: set OUT=directory (the recipe writes its files there))
endif

# The recipe files are prerequisites: make cannot name one with spaces, and for a missing one it
# would only say that it has no rule for the first target that needs it.
$(foreach f,$(PREREQ_FILES),$(if $(findstring $(space),$($(f))),$(error $(f)='$($(f))' cannot be a make prerequisite: use a path without spaces)))
$(foreach f,$(PREREQ_FILES),$(if $(wildcard $($(f))),,$(error $(f)=$($(f)): no such file)))

# Written without a final newline: make 4.3's $(file <) does not strip it inside every expansion.
VARS_STAMPS := $(foreach n,$(VARS),$(OUT)/.vars-$(n))
$(VARS_STAMPS): $(OUT)/.vars-%:
	@mkdir -p $(call q,$(OUT))
	@printf '%s' $(call q,$(VARS_$*)) > $(call q,$@.tmp) && mv $(call q,$@.tmp) $(call q,$@)

# A stamp whose text changed is remade (FORCE), and so is everything that depends on it. Read here,
# not in a recipe, so `make -n` and `make -q` see the change too.
STALE_VARS := $(foreach n,$(VARS),$(if $(call differ,$(file <$(OUT)/.vars-$(n)),$(VARS_$(n))),$(OUT)/.vars-$(n)))
ifneq ($(STALE_VARS),)
$(STALE_VARS): FORCE
endif
.PHONY: FORCE
FORCE:
