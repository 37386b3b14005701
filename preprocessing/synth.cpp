#include "preprocessing/synth.h"
