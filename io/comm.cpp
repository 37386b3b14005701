#include "io/comm.h"
