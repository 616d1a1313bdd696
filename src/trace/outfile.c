/* outfile.c — how gpumem writes a file (trace.h, gm__outfile_*): never
 * through a symbolic link at the path, and a regular file through a
 * temporary file beside it, renamed over the path only once every write,
 * flush, fsync and close succeeded, so a failure (a full disk) leaves the
 * previous file whole. A device or FIFO at the path (/dev/null) is written
 * as it is; appending (a log) opens the path itself, O_NOFOLLOW. The CLI's
 * outputs (cli_out) and the library's trace writers all use it. */
#include "trace.h"

#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static int fail(gm__outfile *o, int e, const char *what) {
    if (o->tmp[0]) unlink(o->tmp);
    o->tmp[0] = '\0';
    return gm__set_error(GM_EIO, "cannot write '%s': %s", o->path, what ? what : strerror(e));
}

int gm__outfile_open(gm__outfile *o, const char *path, bool append) {
    *o = (gm__outfile){.path = path, .append = append};
    struct stat st;
    bool exists = lstat(path, &st) == 0;
    if (!exists && errno != ENOENT) return fail(o, errno, NULL);
    if (exists && S_ISLNK(st.st_mode))
        return fail(o, 0, "it is a symbolic link: gpumem does not write through links; remove it or give the "
                          "path it points to");
    if (exists && S_ISDIR(st.st_mode)) return fail(o, 0, "it is a directory");
    o->replaced = exists;
    int fd;
    if (append || (exists && !S_ISREG(st.st_mode))) {
        fd = open(path, O_WRONLY | O_NOFOLLOW | O_CLOEXEC | (append ? O_APPEND | O_CREAT : 0), 0666);
    } else {
        const char *slash = strrchr(path, '/');
        int dirlen = slash ? (int)(slash - path + 1) : 0;
        if (snprintf(o->tmp, sizeof o->tmp, "%.*s.%s.XXXXXX", dirlen, path, slash ? slash + 1 : path) >=
            (int)sizeof o->tmp) {
            o->tmp[0] = '\0';
            return fail(o, ENAMETOOLONG, NULL);
        }
        fd = mkstemp(o->tmp); /* O_EXCL: nothing planted there is followed */
        if (fd < 0) o->tmp[0] = '\0';
        mode_t um = umask(0);
        umask(um);
        if (fd >= 0) fchmod(fd, 0666 & ~um); /* what a plain create makes (mkstemp: 0600) */
    }
    if (fd < 0) return fail(o, errno, NULL);
    if (!(o->f = fdopen(fd, append ? "a" : "w"))) {
        int e = errno;
        close(fd);
        return fail(o, e, NULL);
    }
    return GM_OK;
}

int gm__outfile_close(gm__outfile *o, bool ok) {
    int e = 0;
    if (o->f) {
        if (fflush(o->f) != 0 || ferror(o->f)) e = errno ? errno : EIO;
        if (!e && o->tmp[0] && fsync(fileno(o->f)) != 0) e = errno;
        if (fclose(o->f) != 0 && !e) e = errno;
        o->f = NULL;
    }
    if (!e && ok && o->tmp[0] && rename(o->tmp, o->path) != 0) e = errno;
    if (e || !ok) return fail(o, e, e ? NULL : "the writer failed");
    o->tmp[0] = '\0';
    return GM_OK;
}

int gm__write_file(const char *path, const void *buf, size_t len, bool gzip) {
    gm__outfile o;
    int rc = gm__outfile_open(&o, path, false);
    if (rc) return rc;
    bool ok = true;
    if (gzip) { /* a gzip member written through the FILE, so every check above applies */
        z_stream z = {0};
        uint8_t out[1 << 16];
        ok = deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK;
        const uint8_t *p = buf;
        size_t left = len;
        int zr = Z_OK;
        while (ok && zr != Z_STREAM_END) {
            if (!z.avail_in && left) {
                z.next_in = (Bytef *)(uintptr_t)p;
                z.avail_in = (uInt)(left > (1u << 30) ? (1u << 30) : left);
                p += z.avail_in;
                left -= z.avail_in;
            }
            z.next_out = out;
            z.avail_out = sizeof out;
            zr = deflate(&z, left || z.avail_in ? Z_NO_FLUSH : Z_FINISH);
            ok = (zr == Z_OK || zr == Z_STREAM_END || zr == Z_BUF_ERROR) &&
                 fwrite(out, 1, sizeof out - z.avail_out, o.f) == sizeof out - z.avail_out;
        }
        deflateEnd(&z);
    } else {
        ok = fwrite(buf, 1, len, o.f) == len;
    }
    return gm__outfile_close(&o, ok);
}
