# I-JEPA end to end, from a source to a probed encoder (what `make demo` runs, on builtin:digits: no
# downloads): ingest a train and a test set, pretrain with RECIPE and keep its random initialisation
# (--steps 0) as the baseline, encode both sets with both target encoders, score the raw inputs and
# both encoders with the linear and k-NN probes, and print the table (OUT/table.txt).
#
#   make -f recipes/quickstart.mk [OUT=demo] [STEPS=500] [SIZE=16x16] [MESH=data=-1,fsdp=1] [JEPA=jepa]
#
# JEPA defaults to ./.venv/bin/jepa (what `make demo` installs), else the checkout's .venv/bin/jepa,
# else jepa on the PATH (recipes/common.mk).
# One SOURCE is cut into a stratified 80/20 train/test split (SPLIT_SEED); TRAIN_SOURCE and
# TEST_SOURCE name two sources instead (recipes/ijepa-in1k.mk). Every target is a file that appears
# only when its command has succeeded: a dataset's zarr.json (jepa ingest renames the finished dataset
# into place), or a command's --json result written to TARGET.tmp and renamed (recipes/write-result.sh,
# which removes TARGET.tmp on a failure or a signal). So make reruns only what is stale (touch the
# recipe: both runs, the embeddings, the encoder probes and the table rerun; the datasets and the raw
# probes stay) and an interrupted step never counts as done. A changed variable reruns the steps whose
# command it changes (SIZE: everything; STEPS or TRAIN_FLAGS: the pretrained run and what follows; a
# run is replaced with --force, never resumed).
# SIZE shapes the dataset and the model: ingest gets it through SHAPE_FLAGS (--size), both runs as
# --image-size (IMAGE_SIZE, by default the --size in SHAPE_FLAGS; empty: the RECIPE's image_size).
# The baseline (--steps 0) is the model the pretrained run starts from: it gets RECIPE, IMAGE_SIZE,
# MESH and MODEL_FLAGS (the options that shape the encoder or its initialisation: --model,
# --patch-size, --mixer, --seed, ...), not TRAIN_FLAGS (how it is trained: schedules, losses), so a
# changed TRAIN_FLAGS leaves the baseline, its embeddings and its probes alone, but for its
# --batch-size (a run's batch must fit its dataset); an encoder option in TRAIN_FLAGS is refused.
# Runs from any directory; OUT
# is relative to it and may not hold spaces; SOURCE may. RAW_PROBES= (empty) skips the probes of the raw inputs,
# RAW_PROBE_FLAGS adds options to them alone (e.g. --raw-pool 4: 4x4 pixel blocks averaged first);
# PROBE_TYPES chooses among linear, knn and attentive.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= demo
SOURCE ?= builtin:digits
TRAIN_SOURCE ?= $(SOURCE)
TEST_SOURCE ?= $(SOURCE)
# The source's own name (a folder's, not its path); the spaces a path may hold are kept through notdir,
# which splits at them.
TITLE ?= $(subst |space|, ,$(notdir $(abspath $(subst $(space),|space|,$(SOURCE))))) test split
RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-digits-tiny.toml
PYTHON ?= python3
SIZE ?= 16x16
SHAPE_FLAGS ?= --size $(SIZE)
SPLIT_SEED ?= 0
INGEST_FLAGS ?=
STEPS ?=
MESH ?=
IMAGE_SIZE ?= $(call flag_value,--size,$(SHAPE_FLAGS))
MODEL_FLAGS ?=
TRAIN_FLAGS ?=
PROBE_FLAGS ?=
RAW_PROBE_FLAGS ?=
RAW_PROBES ?= yes
PROBE_TYPES ?= linear knn
PROBES = $(foreach p,$(PROBE_TYPES),$(if $(RAW_PROBES),$(OUT)/probe-$(p)-raw.json) $(OUT)/probe-$(p)-init.json \
            $(OUT)/probe-$(p)-pretrained.json)

# The arguments of each command whose variables can change; recipes/common.mk reruns a target when
# they differ from the last run's (OUT/.vars-<name>). RECIPE is made absolute so that the same
# recipe named from another directory is the same text.
SPLIT = $(if $(call differ,$(TRAIN_SOURCE),$(TEST_SOURCE)),,--split $(1) --seed $(SPLIT_SEED))
INGEST = ingest $(call q,$(call home,$(1))) $(call q,$(OUT)/data-$(2).zarr) $(SHAPE_FLAGS) $(call SPLIT,$(2)) $(INGEST_FLAGS) --force -q
TRAIN = train --config $(call q,$(abspath $(RECIPE))) --data $(call q,$(OUT)/data-train.zarr) --force --json \
        $(if $(MESH),--mesh $(MESH)) $(if $(IMAGE_SIZE),--image-size $(IMAGE_SIZE)) $(MODEL_FLAGS) $(2) \
        --out $(call q,$(OUT)/run-$(1))
# The baseline runs at TRAIN_FLAGS's --batch-size: a run's batch must fit its dataset (it does not
# change the initial weights).
BATCH = $(call flag_value,--batch-size,$(TRAIN_FLAGS))
# The options of `jepa train` that shape the encoder or its initialisation: MODEL_FLAGS, not TRAIN_FLAGS.
MODEL_OPTIONS := --model --patch-size --image-size --mixer --ssm-state --ssm-step --scan-order --ssm-gaps --seed
SOURCE_train = $(TRAIN_SOURCE)
SOURCE_test = $(TEST_SOURCE)
VARS := data-train data-test run-init run-pretrained probe table
VARS_data-train = $(call INGEST,$(SOURCE_train),train)
VARS_data-test = $(call INGEST,$(SOURCE_test),test)
VARS_run-init = $(call TRAIN,init,$(if $(BATCH),--batch-size $(BATCH))) --steps 0
VARS_run-pretrained = $(call TRAIN,pretrained,$(TRAIN_FLAGS)) $(if $(STEPS),--steps $(STEPS))
VARS_probe = $(PROBE_FLAGS) $(RAW_PROBE_FLAGS)
VARS_table = --title $(call q,$(TITLE)) $(foreach f,$(PROBES),$(call q,$(f)))
PREREQ_FILES := RECIPE

.DEFAULT_GOAL := all
include $(HERE)common.mk

.PHONY: all
.DELETE_ON_ERROR:
.SECONDARY:  # every target is kept: the embeddings and datasets are results, not temporaries
all: $(OUT)/table.txt
	@cat $(call q,$<)

$(OUT)/data-%.zarr/zarr.json: $(OUT)/.vars-data-%
	$(JEPA) $(VARS_data-$*)

$(OUT)/run-%.json: $(OUT)/data-train.zarr/zarr.json $(RECIPE) $(OUT)/.vars-run-%
	$(WRITE) $(JEPA) $(VARS_run-$*)

$(OUT)/emb-init-%.json: $(OUT)/run-init.json $(OUT)/data-%.zarr/zarr.json
	$(WRITE) $(JEPA) encode-latents $(call q,$(OUT)/run-init) $(call q,$(OUT)/data-$*.zarr) -o $(call q,$(OUT)/emb-init-$*.zarr) --force --json -q

$(OUT)/emb-pretrained-%.json: $(OUT)/run-pretrained.json $(OUT)/data-%.zarr/zarr.json
	$(WRITE) $(JEPA) encode-latents $(call q,$(OUT)/run-pretrained) $(call q,$(OUT)/data-$*.zarr) -o $(call q,$(OUT)/emb-pretrained-$*.zarr) --force --json -q

$(OUT)/probe-%-raw.json: $(OUT)/data-train.zarr/zarr.json $(OUT)/data-test.zarr/zarr.json $(OUT)/.vars-probe
	$(WRITE) $(JEPA) probe $* $(call q,$(OUT)/data-train.zarr) $(call q,$(OUT)/data-test.zarr) --raw --json $(PROBE_FLAGS) $(RAW_PROBE_FLAGS)

$(OUT)/probe-%-init.json: $(OUT)/emb-init-train.json $(OUT)/emb-init-test.json $(OUT)/.vars-probe
	$(WRITE) $(JEPA) probe $* $(call q,$(OUT)/emb-init-train.zarr) $(call q,$(OUT)/emb-init-test.zarr) --json $(PROBE_FLAGS)

$(OUT)/probe-%-pretrained.json: $(OUT)/emb-pretrained-train.json $(OUT)/emb-pretrained-test.json $(OUT)/.vars-probe
	$(WRITE) $(JEPA) probe $* $(call q,$(OUT)/emb-pretrained-train.zarr) $(call q,$(OUT)/emb-pretrained-test.zarr) --json $(PROBE_FLAGS)

$(OUT)/table.txt: $(PROBES) $(OUT)/.vars-table
	$(WRITE) $(PYTHON) $(call q,$(HERE)../scripts/probe_table.py) $(VARS_table)

$(if $(filter $(MODEL_OPTIONS) $(addsuffix =%,$(MODEL_OPTIONS)),$(TRAIN_FLAGS)),$(error TRAIN_FLAGS has \
  $(firstword $(filter $(MODEL_OPTIONS) $(addsuffix =%,$(MODEL_OPTIONS)),$(TRAIN_FLAGS))), which shapes the encoder: \
  pass it in MODEL_FLAGS (both runs, the baseline too, take those)))

# A source that is not there would fail in jepa ingest, once per split, among make's own lines: when
# an ingest is about to run, say it once, before anything runs.
no_source = $(if $(filter builtin:%,$(1)),,$(if $(shell test -e $(call q,$(call home,$(1))) && echo y),,$(1)))
$(foreach s,train test,$(if $(filter $(OUT)/.vars-data-$(s),$(STALE_VARS)),\
  $(if $(call no_source,$(SOURCE_$(s))),$(error $(SOURCE_$(s)): no such file or directory (the source to ingest)))))
