#define _GNU_SOURCE
#include <fcntl.h>
#include "cfluxsys.h"

int cfluxsys_reserve(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
}

int cfluxsys_release(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}
