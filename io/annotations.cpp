#include "io/annotations.h"
