# I-JEPA end to end, from a source to a probed encoder (what `make demo` runs, on builtin:digits: no
# downloads): ingest a train and a test set, pretrain with RECIPE and keep its random initialisation
# (--steps 0) as the baseline, encode both sets with both target encoders, score the raw inputs and
# both encoders with the linear and k-NN probes, and print the table (OUT/table.txt).
#
#   make -f recipes/quickstart.mk [OUT=demo] [STEPS=500] [SIZE=16x16] [MESH=data=-1,fsdp=1] [JEPA=jepa]
#
# One SOURCE is cut into a stratified 80/20 train/test split (SPLIT_SEED); TRAIN_SOURCE and
# TEST_SOURCE name two sources instead (recipes/ijepa-in1k.mk). Every target is a file that appears
# only when its command has succeeded: a dataset's zarr.json (jepa ingest renames the finished dataset
# into place), or a command's --json result written to a temporary name and renamed. So make reruns
# only what is stale (touch the recipe: both runs, the embeddings, the encoder probes and the table
# rerun; the datasets and the raw probes stay) and an interrupted step never counts as done. Runs
# from any directory; OUT is relative to it. RAW_PROBES= (empty) skips the probes of the raw inputs;
# PROBE_TYPES chooses among linear, knn and attentive.

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= demo
SOURCE ?= builtin:digits
TRAIN_SOURCE ?= $(SOURCE)
TEST_SOURCE ?= $(SOURCE)
TITLE ?= $(SOURCE) test split
RECIPE ?= $(HERE)../jepa_cli/recipes/ijepa-digits-tiny.toml
JEPA ?= jepa
PYTHON ?= python3
SIZE ?= 16x16
SHAPE_FLAGS ?= --size $(SIZE)
SPLIT_SEED ?= 0
INGEST_FLAGS ?=
STEPS ?=
MESH ?=
TRAIN_FLAGS ?=
PROBE_FLAGS ?=

SPLIT = $(if $(filter $(TRAIN_SOURCE),$(TEST_SOURCE)),--split $(1) --seed $(SPLIT_SEED))
TRAIN := $(JEPA) train --config $(RECIPE) --data $(OUT)/data-train.zarr --force --json \
         $(if $(MESH),--mesh $(MESH)) $(TRAIN_FLAGS)
RAW_PROBES ?= yes
PROBE_TYPES ?= linear knn
PROBES := $(foreach p,$(PROBE_TYPES),$(if $(RAW_PROBES),$(OUT)/probe-$(p)-raw.json) $(OUT)/probe-$(p)-init.json \
            $(OUT)/probe-$(p)-pretrained.json)

.PHONY: all
.DELETE_ON_ERROR:
.SECONDARY:  # every target is kept: the embeddings and datasets are results, not temporaries
all: $(OUT)/table.txt
	@cat $<

$(OUT)/data-train.zarr/zarr.json:
	@mkdir -p $(OUT)
	$(JEPA) ingest $(TRAIN_SOURCE) $(OUT)/data-train.zarr $(SHAPE_FLAGS) $(call SPLIT,train) $(INGEST_FLAGS) --force -q

$(OUT)/data-test.zarr/zarr.json:
	@mkdir -p $(OUT)
	$(JEPA) ingest $(TEST_SOURCE) $(OUT)/data-test.zarr $(SHAPE_FLAGS) $(call SPLIT,test) $(INGEST_FLAGS) --force -q

$(OUT)/run-init.json: $(OUT)/data-train.zarr/zarr.json $(RECIPE)
	$(TRAIN) --out $(OUT)/run-init --steps 0 > $@.tmp
	@mv $@.tmp $@

$(OUT)/run-pretrained.json: $(OUT)/data-train.zarr/zarr.json $(RECIPE)
	$(TRAIN) --out $(OUT)/run-pretrained $(if $(STEPS),--steps $(STEPS)) > $@.tmp
	@mv $@.tmp $@

$(OUT)/emb-init-%.json: $(OUT)/run-init.json $(OUT)/data-%.zarr/zarr.json
	$(JEPA) encode-latents $(OUT)/run-init $(OUT)/data-$*.zarr -o $(OUT)/emb-init-$*.zarr --force --json -q > $@.tmp
	@mv $@.tmp $@

$(OUT)/emb-pretrained-%.json: $(OUT)/run-pretrained.json $(OUT)/data-%.zarr/zarr.json
	$(JEPA) encode-latents $(OUT)/run-pretrained $(OUT)/data-$*.zarr -o $(OUT)/emb-pretrained-$*.zarr --force --json -q > $@.tmp
	@mv $@.tmp $@

$(OUT)/probe-%-raw.json: $(OUT)/data-train.zarr/zarr.json $(OUT)/data-test.zarr/zarr.json
	$(JEPA) probe $* $(OUT)/data-train.zarr $(OUT)/data-test.zarr --raw --json $(PROBE_FLAGS) > $@.tmp
	@mv $@.tmp $@

$(OUT)/probe-%-init.json: $(OUT)/emb-init-train.json $(OUT)/emb-init-test.json
	$(JEPA) probe $* $(OUT)/emb-init-train.zarr $(OUT)/emb-init-test.zarr --json $(PROBE_FLAGS) > $@.tmp
	@mv $@.tmp $@

$(OUT)/probe-%-pretrained.json: $(OUT)/emb-pretrained-train.json $(OUT)/emb-pretrained-test.json
	$(JEPA) probe $* $(OUT)/emb-pretrained-train.zarr $(OUT)/emb-pretrained-test.zarr --json $(PROBE_FLAGS) > $@.tmp
	@mv $@.tmp $@

$(OUT)/table.txt: $(PROBES)
	$(PYTHON) $(HERE)../scripts/probe_table.py --title "$(TITLE)" $^ > $@.tmp
	@mv $@.tmp $@
