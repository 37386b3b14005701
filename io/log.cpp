#include "io/log.h"
