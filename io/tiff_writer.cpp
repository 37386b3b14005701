#include "io/tiff_writer.h"
