/* cmd_config.c — 'gpumem config': the allocator settings and policies, from
 * the library's own tables (gm_setting_info, gm_policy_info), and a check of
 * a settings string ("is this PYTORCH_CUDA_ALLOC_CONF valid, and what does it
 * change?") with every key's value. */
#include "cli.h"

#include "gpumem/gpumem.h"

#include <string.h>

static void list(bool json) {
    if (json) printf("{\"default_policy\":\"%s\",\"policies\":[", CLI_RUN_DEFAULT_POLICY);
    else printf("policies (policy:NAME; the default is the one gpumem run and gpumem.torch.install() use\n"
                "when the settings name none; replay, tune and report model torch unless told otherwise)\n");
    for (int k = 0; k < gm_policy_count(); k++) {
        gm_policy_desc p;
        if (gm_policy_info(k, &p) != GM_OK) continue;
        if (json) {
            printf("%s{\"name\":", k ? "," : "");
            cli_json_string(stdout, p.name);
            printf(",\"doc\":");
            cli_json_string(stdout, p.doc);
            printf("}");
        } else {
            printf("  %-8s %s%s\n", p.name, p.doc, !strcmp(p.name, CLI_RUN_DEFAULT_POLICY) ? " (default)" : "");
        }
    }
    if (json) printf("],\"settings\":[");
    else printf("\nsettings (key:value, comma-separated, as in PYTORCH_CUDA_ALLOC_CONF)\n");
    for (int i = 0; i < gm_setting_count(); i++) {
        gm_setting_desc s;
        if (gm_setting_info(i, &s) != GM_OK) continue;
        if (json) {
            const char *f[][2] = {{"key", s.key},     {"alias", s.alias}, {"policy", s.policy},
                                  {"default", s.def}, {"range", s.range}, {"doc", s.doc}};
            printf("%s{", i ? "," : "");
            for (size_t j = 0; j < sizeof f / sizeof f[0]; j++) {
                printf("%s\"%s\":", j ? "," : "", f[j][0]);
                if (f[j][1]) cli_json_string(stdout, f[j][1]);
                else printf("null");
            }
            printf("}");
        } else {
            printf("  %-33s default %-9s %s\n  %-33s %s%s%s\n", s.key, s.def, s.range, "", s.doc,
                   s.policy ? "; policy:" : "", s.policy ? s.policy : "");
            if (s.alias) printf("  %-33s also spelled %s\n", "", s.alias);
        }
    }
    if (json) printf("]}\n");
}

int cmd_config(int argc, char **argv) {
    bool do_list = false, json = false;
    const struct cli_opt opts[] = {
        {"list", 0, CLI_FLAG, &do_list, NULL, "list every policy and setting with its default and range",
         NULL, 0, 0},
        CLI_OPT_JSON(&json),
    };
    const struct cli_spec spec = {
        .cmd = argv[0], .args = "[STR]", .opts = opts, .nopts = CLI_NOPTS(opts), .max_pos = 1,
        .about = "With --list, the allocator policies and settings gpumem accepts (GPUMEM_CONF,\n"
                 "install(conf), --conf). With STR, checks it as gpumem run --conf, GPUMEM_CONF and\n"
                 "install(conf) read it: under policy:" CLI_RUN_DEFAULT_POLICY " unless STR names a policy (policy:torch\n"
                 "checks it as PyTorch's own allocator reads PYTORCH_CUDA_ALLOC_CONF), and prints\n"
                 "every key's resulting value.",
        .epilog = "Exit status: 0 valid, 2 invalid STR or bad usage.",
    };
    char *str = NULL;
    int n = 0;
    int rc = cli_parse(&spec, argc, argv, &str, &n);
    if (rc) return cli_parse_exit(rc);
    if (do_list || !n) {
        list(json);
        return 0;
    }
    /* one rule with gpumem run: the policy it would use unless STR names one */
    char eff[2048];
    cli_effective_conf(str, eff, sizeof eff);
    bool assumed = strcmp(eff, str) != 0;
    gm_config cfg;
    gm_config_init(&cfg);
    char err[256];
    if (cli_config_parse(&cfg, eff, err, sizeof err) != GM_OK)
        return cli_usage_error(argv[0], "%s%s", err,
                               assumed ? " (checked under policy:" CLI_RUN_DEFAULT_POLICY ", what gpumem run uses when "
                                         "the string names no policy)"
                                       : "");
    char canon[1024];
    if (gm_config_format(&cfg, canon, sizeof canon) != GM_OK) return cli_error(argv[0], "%s", gm_last_error_detail());
    if (json) {
        printf("{\"conf\":");
        cli_json_string(stdout, canon);
        printf(",\"policy_assumed\":%s", assumed ? "true" : "false");
        printf(",\"values\":{");
    } else {
        if (assumed)
            printf("policy:    %s (assumed: the string names none, and gpumem run would use this one;\n"
                   "           name policy:torch to check it for PyTorch's own allocator)\n", CLI_RUN_DEFAULT_POLICY);
        printf("canonical: %s\n", *canon ? canon : "(all defaults)");
    }
    for (int i = 0; i < gm_setting_count(); i++) {
        gm_setting_desc s;
        char v[512];
        if (gm_setting_info(i, &s) != GM_OK || gm_config_get(&cfg, s.key, v, sizeof v) != GM_OK) continue;
        if (json) {
            printf("%s\"%s\":", i ? "," : "", s.key);
            cli_json_string(stdout, v);
        } else {
            printf("  %-33s %s%s\n", s.key, v, strcmp(v, s.def) ? "" : "  (default)");
        }
    }
    if (json) printf("}}\n");
    return 0;
}
