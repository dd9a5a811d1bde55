#define _GNU_SOURCE
#include <fcntl.h>
#include "cfluxsys.h"

int cfluxsys_reserve(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_KEEP_SIZE, offset, length);
}

int cfluxsys_release(int fd, off_t offset, off_t length) {
    return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length);
}

#include <stdint.h>
#include <string.h>

static uint32_t crc32c_table[8][256];
static int crc32c_ready;

static void crc32c_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc32c_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc32c_table[t][i] = (crc32c_table[t - 1][i] >> 8) ^ crc32c_table[0][crc32c_table[t - 1][i] & 0xFF];
    crc32c_ready = 1;
}

static uint32_t crc32c_soft(uint32_t c, const uint8_t *p, size_t n) {
    if (!crc32c_ready) crc32c_init();
    while (n >= 8) {
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        c = crc32c_table[7][lo & 0xFF] ^ crc32c_table[6][(lo >> 8) & 0xFF] ^ crc32c_table[5][(lo >> 16) & 0xFF]
            ^ crc32c_table[4][lo >> 24] ^ crc32c_table[3][p[4]] ^ crc32c_table[2][p[5]] ^ crc32c_table[1][p[6]]
            ^ crc32c_table[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--) c = crc32c_table[0][(c ^ *p++) & 0xFF] ^ (c >> 8);
    return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2")))
static uint32_t crc32c_hw(uint32_t c, const uint8_t *p, size_t n) {
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = __builtin_ia32_crc32di(c64, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c64;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

uint32_t cfluxsys_crc32c(uint32_t crc, const uint8_t *p, size_t n) {
    uint32_t c = ~crc;
#if defined(__x86_64__)
    static int hw = -1;
    if (hw < 0) hw = __builtin_cpu_supports("sse4.2") ? 1 : 0;
    c = hw ? crc32c_hw(c, p, n) : crc32c_soft(c, p, n);
#else
    c = crc32c_soft(c, p, n);
#endif
    return ~c;
}

int cfluxsys_allocate(int fd, off_t offset, off_t length) {
    return fallocate(fd, 0, offset, length);
}
