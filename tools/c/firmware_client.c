/*
 * An example firmware client for fulcrumd, in C: what a robot's firmware does to get
 * detections for its camera frames.
 *
 *   firmware_client SOCKET [FRAMES [WIDTH HEIGHT]] [--dump-frame FILE]
 *
 * It connects to the daemon's SOCK_SEQPACKET socket, greets it (Hello with the schema hash;
 * the daemon answers Welcome), creates a memfd ring of two frame slots, seals it against
 * shrinking and passes it once with SCM_RIGHTS (AttachRing), then writes camera-like NV12
 * frames into the ring and sends only their offsets (Infer), printing the detections each
 * reply carries, in the frame's pixels. A reply from reloaded weights (its weights
 * generation differs from the one greeted) may mean other classes or another input size, so
 * the client greets again and asks for the class names anew before naming classes. At the end
 * it asks for the daemon's stats.
 * --dump-frame writes the first frame's bytes to FILE (the tests send the same frame from
 * Rust and compare). Build:
 *
 *   cc -O2 -I board/capi/include tools/c/firmware_client.c target/release/libfulcrum_protocol.a -o firmware_client
 *
 * Exit status: 0 when every frame was answered, 1 otherwise.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "fulcrum_protocol.h"

static uint8_t tx[FULCRUM_MAX_MESSAGE_LEN];
static uint8_t rx[FULCRUM_MAX_MESSAGE_LEN + 1];

static uint64_t now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* Sends one message, with `pass_fd` as SCM_RIGHTS when it is not -1. */
static int send_message(int sock, const uint8_t *buf, int len, int pass_fd) {
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = (size_t)len};
    union {
        char space[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } control;
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (pass_fd >= 0) {
        memset(&control, 0, sizeof control);
        msg.msg_control = control.space;
        msg.msg_controllen = sizeof control.space;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    if (sendmsg(sock, &msg, MSG_NOSIGNAL) != len) {
        perror("sendmsg");
        return -1;
    }
    return 0;
}

/* Receives and decodes one reply; an Error reply is printed and fails. Returns its length. */
static int receive_reply(int sock, FulcrumReply *reply) {
    ssize_t n = recv(sock, rx, sizeof rx, 0);
    if (n <= 0) {
        fprintf(stderr, "the daemon closed the connection%s%s\n", n < 0 ? ": " : "",
                n < 0 ? strerror(errno) : "");
        return -1;
    }
    int status = fulcrum_decode_reply(rx, (size_t)n, reply);
    if (status < 0) {
        fprintf(stderr, "undecodable reply: %s\n", fulcrum_status_text(status));
        return -1;
    }
    if (reply->kind == FULCRUM_KIND_ERROR) {
        fprintf(stderr, "the daemon says: %.*s (%s)\n", (int)reply->text_len,
                (const char *)reply->text, fulcrum_error_code_name(reply->error_code));
        return -1;
    }
    return (int)n;
}

/* A camera-like NV12 frame: a gradient with a bright square that moves with `t`. */
static void draw_nv12(uint8_t *frame, int w, int h, int t) {
    int side = h / 4, x0 = (t * 7) % (w - side), y0 = h / 3;
    for (int y = 0; y < h; y++)
        for (int x = 0; x < w; x++) {
            int inside = x >= x0 && x < x0 + side && y >= y0 && y < y0 + side;
            frame[y * w + x] = inside ? 200 : (uint8_t)(40 + (x + y) % 64);
        }
    uint8_t *uv = frame + w * h;
    for (int y = 0; y < h / 2; y++)
        for (int x = 0; x < w; x += 2) {
            int inside = x >= x0 && x < x0 + side && 2 * y >= y0 && 2 * y < y0 + side;
            uv[y * w + x] = inside ? 90 : 128;      /* U */
            uv[y * w + x + 1] = inside ? 200 : 128; /* V */
        }
}

/* What the served model is: its class names, one a line, and the weights generation. */
struct model {
    char names[64][64];
    uint32_t generation;
};

/* Greets (Hello → Welcome) and asks for the class names; at connect and after a reload. */
static int learn_model(int sock, uint32_t *seq, struct model *m) {
    FulcrumReply reply;
    int len = fulcrum_encode_hello(++*seq, tx, sizeof tx);
    if (len < 0 || send_message(sock, tx, len, -1) < 0 || receive_reply(sock, &reply) < 0)
        return -1;
    printf("model: input %ux%u, %u classes, engine %s, weights generation %u\n",
           reply.input_width, reply.input_height, reply.classes,
           reply.engine == 2 ? "vulkan" : "cpu", reply.weights_generation);
    m->generation = reply.weights_generation;
    len = fulcrum_encode_request(FULCRUM_KIND_CLASSES_REQUEST, ++*seq, tx, sizeof tx);
    if (len < 0 || send_message(sock, tx, len, -1) < 0 || receive_reply(sock, &reply) < 0)
        return -1;
    memset(m->names, 0, sizeof m->names);
    for (int i = 0, k = 0, c = 0; i <= reply.text_len && k < 64; i++) {
        if (i == reply.text_len || reply.text[i] == '\n') {
            m->names[k++][c] = 0;
            c = 0;
        } else if (c < 63) {
            m->names[k][c++] = (char)reply.text[i];
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    const char *dump = NULL;
    int positional[4] = {0}, npos = 0;
    const char *socket_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--dump-frame") == 0 && i + 1 < argc) {
            dump = argv[++i];
        } else if (!socket_path) {
            socket_path = argv[i];
        } else if (npos < 3) {
            positional[npos++] = atoi(argv[i]);
        }
    }
    if (!socket_path) {
        fprintf(stderr, "usage: %s SOCKET [FRAMES [WIDTH HEIGHT]] [--dump-frame FILE]\n", argv[0]);
        return 2;
    }
    int frames = npos > 0 ? positional[0] : 5;
    int width = npos > 2 ? positional[1] : 640, height = npos > 2 ? positional[2] : 480;

    int sock = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    snprintf(addr.sun_path, sizeof addr.sun_path, "%s", socket_path);
    if (sock < 0 || connect(sock, (struct sockaddr *)&addr, sizeof addr) < 0) {
        fprintf(stderr, "connecting to %s: %s\n", socket_path, strerror(errno));
        return 1;
    }
    FulcrumReply reply;
    uint32_t seq = 0;
    static struct model model;
    int len;
    if (learn_model(sock, &seq, &model) < 0)
        return 1;

    /* The ring: two frame slots in a sealed memfd, mapped here read-write. */
    int64_t frame_len = fulcrum_frame_len(FULCRUM_PIXEL_FORMAT_NV12, (uint16_t)width, (uint16_t)height, 0);
    if (frame_len < 0) {
        fprintf(stderr, "%dx%d NV12: %s\n", width, height, fulcrum_status_text((int)frame_len));
        return 1;
    }
    size_t ring_len = 2 * (size_t)frame_len;
    int ring = memfd_create("camera-frames", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (ring < 0 || ftruncate(ring, (off_t)ring_len) < 0 ||
        fcntl(ring, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_SEAL) < 0) {
        perror("creating the ring");
        return 1;
    }
    uint8_t *slots = mmap(NULL, ring_len, PROT_READ | PROT_WRITE, MAP_SHARED, ring, 0);
    if (slots == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    len = fulcrum_encode_attach_ring(++seq, ring_len, tx, sizeof tx);
    if (len < 0 || send_message(sock, tx, len, ring) < 0 || receive_reply(sock, &reply) < 0)
        return 1;

    int answered = 0;
    for (int i = 0; i < frames; i++) {
        uint64_t offset = (uint64_t)(i % 2) * (uint64_t)frame_len;
        draw_nv12(slots + offset, width, height, i);
        if (i == 0 && dump) {
            FILE *f = fopen(dump, "wb");
            if (!f || fwrite(slots, 1, (size_t)frame_len, f) != (size_t)frame_len) {
                perror(dump);
                return 1;
            }
            fclose(f);
        }
        FulcrumFrame frame = {
            .format = FULCRUM_PIXEL_FORMAT_NV12,
            .in_ring = 1,
            .width = (uint16_t)width,
            .height = (uint16_t)height,
            .length = (uint32_t)frame_len,
            .offset = offset,
        };
        uint64_t captured = now_us();
        len = fulcrum_encode_infer(++seq, captured, &frame, NULL, tx, sizeof tx);
        if (len < 0) {
            fprintf(stderr, "frame %d: %s\n", i, fulcrum_status_text(len));
            continue;
        }
        int n;
        if (send_message(sock, tx, len, -1) < 0 || (n = receive_reply(sock, &reply)) < 0)
            continue;
        if (reply.kind != FULCRUM_KIND_DETECTIONS || reply.sequence != seq || reply.timestamp_us != captured) {
            fprintf(stderr, "frame %d: unexpected reply kind %u sequence %u\n", i, reply.kind, reply.sequence);
            continue;
        }
        answered++;
        printf("frame %d: %u detections in %ux%u (engine %u us, total %u us, min score %.2f)\n",
               i, reply.count, reply.frame_width, reply.frame_height, reply.engine_us,
               reply.total_us, reply.min_score);
        /* Reloaded weights: the class names below may be stale, so they are not used. */
        int reloaded = reply.weights_generation != model.generation;
        for (uint16_t k = 0; k < reply.count; k++) {
            FulcrumDetection d;
            if (fulcrum_reply_detection(rx, (size_t)n, k, &d) == 0)
                printf("  %s %.4f [%.1f, %.1f, %.1f, %.1f]\n",
                       !reloaded && d.class_id < 64 && model.names[d.class_id][0]
                           ? model.names[d.class_id]
                           : "?",
                       d.score, d.x0, d.y0, d.x1, d.y1);
        }
        if (reloaded) {
            printf("weights reloaded (generation %u -> %u): asking what the model is\n",
                   model.generation, reply.weights_generation);
            if (learn_model(sock, &seq, &model) < 0)
                return 1;
        }
    }

    len = fulcrum_encode_request(FULCRUM_KIND_STATS_REQUEST, ++seq, tx, sizeof tx);
    if (len >= 0 && send_message(sock, tx, len, -1) == 0 && receive_reply(sock, &reply) >= 0)
        printf("stats: %llu requests, %llu errors, p50 %u us, p99 %u us, engine forward %u us\n",
               (unsigned long long)reply.requests, (unsigned long long)reply.errors,
               reply.p50_us, reply.p99_us, reply.forward_us);
    munmap(slots, ring_len);
    close(ring);
    close(sock);
    return answered == frames ? 0 : 1;
}
