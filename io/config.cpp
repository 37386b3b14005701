#include "io/config.h"
