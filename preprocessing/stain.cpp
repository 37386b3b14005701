#include "preprocessing/stain.h"
