#include "report.h"
int gm_report_write_html(FILE *f, const gm_attribution *a, const gm_timeline *tl,
                         const gm_frame_row *rows, size_t nrows, const gm_report_opts *o) { return -1; }
