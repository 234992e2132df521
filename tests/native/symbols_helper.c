/* A process with native functions of known names for tests/tests/profile_symbols.rs.
 *
 * Built by the test (gcc -O1 -fno-omit-frame-pointer -rdynamic): `exported_*` functions are in
 * .dynsym as well as .symtab; `static_*` ones only in .symtab, so a stripped copy keeps no name
 * for them. Each static function lies after an exported one (gcc puts callees first:
 * `static_after_exported` follows `exported_middle`): a lookup that named the nearest preceding
 * symbol would lend it that exported name.
 *
 * Prints `fn <name> <address>` for each function, then `READY`, and waits for stdin to close
 * (or, with the argument `spin`, calls its functions in a loop until killed).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

static volatile uint64_t sink;

__attribute__((noinline)) uint64_t exported_entry(uint64_t n);
__attribute__((noinline)) static uint64_t static_after_exported(uint64_t n);
__attribute__((noinline)) static uint64_t static_leaf(uint64_t n);
__attribute__((noinline)) uint64_t exported_middle(uint64_t n);

__attribute__((noinline)) uint64_t exported_entry(uint64_t n) {
    for (uint64_t i = 0; i < n; i++)
        sink += static_after_exported(i);
    return sink;
}

__attribute__((noinline)) static uint64_t static_after_exported(uint64_t n) {
    uint64_t total = 0;
    for (uint64_t i = 0; i < n % 7; i++)
        total += exported_middle(i);
    return total;
}

__attribute__((noinline)) uint64_t exported_middle(uint64_t n) {
    return static_leaf(n) * 3 + 1;
}

__attribute__((noinline)) static uint64_t static_leaf(uint64_t n) {
    uint64_t x = n;
    for (int i = 0; i < 64; i++)
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    sink ^= x;
    return x;
}

int main(int argc, char **argv) {
    printf("fn exported_entry %p\n", (void *)&exported_entry);
    printf("fn static_after_exported %p\n", (void *)&static_after_exported);
    printf("fn exported_middle %p\n", (void *)&exported_middle);
    printf("fn static_leaf %p\n", (void *)&static_leaf);
    printf("READY\n");
    fflush(stdout);
    if (argc > 1 && strcmp(argv[1], "spin") == 0) {
        for (;;)
            exported_entry(1000);
    }
    char line[64];
    while (fgets(line, sizeof line, stdin))
        ;
    return 0;
}
