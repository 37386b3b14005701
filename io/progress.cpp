#include "io/progress.h"
