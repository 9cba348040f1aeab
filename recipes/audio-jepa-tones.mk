# Audio-JEPA on builtin:tones end to end, no downloads: 1 s clips at 16 kHz, a stratified train/test
# split, jepa_cli/recipes/audio-jepa-small.toml (the recipe whose encoder learns on small speech-like
# data), and the linear and k-NN probes of the pooled log-mel spectrogram (--raw), the random
# initialisation and the pretrained encoder (OUT/table.txt; docs/audio.md). The steps and their files
# are recipes/quickstart.mk's.
#
#   make -f recipes/audio-jepa-tones.mk [OUT=tones] [STEPS=...]
#   make -f recipes/audio-jepa-tones.mk SOURCE=path/to/sounds SHAPE_FLAGS="--sample-rate 16000 --seconds 1"

HERE := $(dir $(lastword $(MAKEFILE_LIST)))
OUT ?= tones
SOURCE ?= builtin:tones
SHAPE_FLAGS ?= --sample-rate 16000 --seconds 1
RECIPE ?= $(HERE)../jepa_cli/recipes/audio-jepa-small.toml

include $(HERE)quickstart.mk
