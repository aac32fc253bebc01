/* The few declarations of QEMU's TCG plugin API (API version 1, QEMU 4.2 … 8.x) that insn_count.c uses.
 *
 * Debian ships no qemu-plugin.h (no -dev package has it), so this project declares what it needs itself,
 * after the documented stable API (docs/devel/tcg-plugins.rst in the QEMU source). The functions are
 * defined in the qemu-system-* executable and bound when QEMU dlopen()s the plugin. QEMU 7.2 accepts
 * plugins that export `qemu_plugin_version` in [1, 1]: check `strings $(which qemu-system-arm)` for
 * "requires API version" when moving to another QEMU (9.0 raised the current version to 2; version 1
 * plugins still load there as long as QEMU's minimum stays 1).
 */
#ifndef TFMCU_QEMU_PLUGIN_API_H_
#define TFMCU_QEMU_PLUGIN_API_H_

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TFMCU_QEMU_PLUGIN_EXPORT __attribute__((visibility("default")))

#define TFMCU_QEMU_PLUGIN_API_VERSION 1

typedef uint64_t qemu_plugin_id_t;

typedef struct qemu_info_t {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;

struct qemu_plugin_tb;
struct qemu_plugin_insn;

enum qemu_plugin_cb_flags {
    QEMU_PLUGIN_CB_NO_REGS,
    QEMU_PLUGIN_CB_R_REGS,
    QEMU_PLUGIN_CB_RW_REGS,
};

enum qemu_plugin_op {
    QEMU_PLUGIN_INLINE_ADD_U64,
};

typedef void (*qemu_plugin_udata_cb_t)(qemu_plugin_id_t id, void *userdata);
typedef void (*qemu_plugin_vcpu_udata_cb_t)(unsigned int vcpu_index, void *userdata);
typedef void (*qemu_plugin_vcpu_tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);

/* Exported by the plugin. */
extern TFMCU_QEMU_PLUGIN_EXPORT int qemu_plugin_version;
TFMCU_QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                                 char **argv);

/* Provided by QEMU. */
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, qemu_plugin_vcpu_tb_trans_cb_t cb);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *tb, size_t idx);
uint64_t qemu_plugin_insn_vaddr(const struct qemu_plugin_insn *insn);
void qemu_plugin_register_vcpu_insn_exec_inline(struct qemu_plugin_insn *insn, enum qemu_plugin_op op, void *ptr,
                                                uint64_t imm);
void qemu_plugin_register_vcpu_insn_exec_cb(struct qemu_plugin_insn *insn, qemu_plugin_vcpu_udata_cb_t cb,
                                            enum qemu_plugin_cb_flags flags, void *userdata);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, qemu_plugin_udata_cb_t cb, void *userdata);
void qemu_plugin_outs(const char *string);

#endif /* TFMCU_QEMU_PLUGIN_API_H_ */
