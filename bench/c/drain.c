/*
 * drain: read N records from a topic with librdkafka and do nothing else with them, so that the reading
 * application is never what limits the rate (the Python benches' reading loop tops out near 2M records/s).
 *
 *   drain plain|share BOOTSTRAP TOPIC PARTITIONS RECORDS GROUP [key=value ...]
 *
 * plain: a consumer assigned partitions 0..PARTITIONS-1 from their start (no group protocol, no commits).
 * share: a share consumer subscribed to TOPIC (implicit acknowledgement: each poll acknowledges the last).
 * key=value pairs are librdkafka settings. Prints "records bytes seconds", the seconds counted from the
 * first record received to the last (as the Python benches time a drain); exits 1 if fewer than RECORDS
 * came within 120 s.
 *
 * The benches link this against the librdkafka that the confluent-kafka wheel bundles, so C and Python
 * clients run the same library version. The wheel ships that library without its header, and the header a
 * distribution packages may predate the share consumer API, so the few functions and the two public structs
 * used here are declared below, as librdkafka's rdkafka.h documents them.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_share_s rd_kafka_share_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct rd_kafka_messages_s rd_kafka_messages_t;
typedef struct rd_kafka_topic_partition_list_s rd_kafka_topic_partition_list_t;

typedef struct {
    int err;
    void *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rd_kafka_message_t;

typedef struct {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    void *opaque;
    int err;
    void *_private;
} rd_kafka_topic_partition_t;

enum { RD_KAFKA_CONSUMER = 1 };
static const int64_t RD_KAFKA_OFFSET_BEGINNING = -2;
static const int32_t RD_KAFKA_PARTITION_UA = -1;

rd_kafka_conf_t *rd_kafka_conf_new(void);
int rd_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr, size_t size);
rd_kafka_t *rd_kafka_new(int type, rd_kafka_conf_t *conf, char *errstr, size_t size);
int rd_kafka_poll_set_consumer(rd_kafka_t *rk);
rd_kafka_topic_partition_list_t *rd_kafka_topic_partition_list_new(int size);
rd_kafka_topic_partition_t *rd_kafka_topic_partition_list_add(rd_kafka_topic_partition_list_t *list,
                                                              const char *topic, int32_t partition);
void rd_kafka_topic_partition_list_destroy(rd_kafka_topic_partition_list_t *list);
int rd_kafka_assign(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *partitions);
rd_kafka_message_t *rd_kafka_consumer_poll(rd_kafka_t *rk, int timeout_ms);
void rd_kafka_message_destroy(rd_kafka_message_t *message);
int rd_kafka_consumer_close(rd_kafka_t *rk);
void rd_kafka_destroy(rd_kafka_t *rk);
rd_kafka_share_t *rd_kafka_share_consumer_new(rd_kafka_conf_t *conf, char *errstr, size_t size);
int rd_kafka_share_subscribe(rd_kafka_share_t *rkshare, const rd_kafka_topic_partition_list_t *topics);
rd_kafka_error_t *rd_kafka_share_poll(rd_kafka_share_t *rkshare, int timeout_ms, rd_kafka_messages_t **batch);
size_t rd_kafka_messages_count(const rd_kafka_messages_t *batch);
rd_kafka_message_t *rd_kafka_messages_get(const rd_kafka_messages_t *batch, size_t i);
void rd_kafka_messages_destroy(rd_kafka_messages_t *batch);
void rd_kafka_error_destroy(rd_kafka_error_t *error);
rd_kafka_error_t *rd_kafka_share_consumer_close(rd_kafka_share_t *rkshare);
void rd_kafka_share_destroy(rd_kafka_share_t *rkshare);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

struct tally {
    long records, bytes;
    double first, last;
};

static void count(struct tally *t, const rd_kafka_message_t *m) {
    if (m->err)
        return;
    double at = now();
    if (!t->records)
        t->first = at;
    t->records++;
    t->bytes += (long)m->len;
    t->last = at;
}

static void drain_plain(rd_kafka_conf_t *conf, const char *topic, int partitions, long want, double deadline,
                        struct tally *t) {
    char err[512];
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
    if (!rk) {
        fprintf(stderr, "drain: %s\n", err);
        exit(2);
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(partitions);
    for (int p = 0; p < partitions; p++)
        rd_kafka_topic_partition_list_add(list, topic, p)->offset = RD_KAFKA_OFFSET_BEGINNING;
    if (rd_kafka_assign(rk, list)) {
        fprintf(stderr, "drain: assign failed\n");
        exit(2);
    }
    rd_kafka_topic_partition_list_destroy(list);
    while (t->records < want && now() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        if (m) {
            count(t, m);
            rd_kafka_message_destroy(m);
        }
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
}

static void drain_share(rd_kafka_conf_t *conf, const char *topic, long want, double deadline, struct tally *t) {
    char err[512];
    rd_kafka_share_t *rks = rd_kafka_share_consumer_new(conf, err, sizeof err);
    if (!rks) {
        fprintf(stderr, "drain: %s\n", err);
        exit(2);
    }
    rd_kafka_topic_partition_list_t *list = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(list, topic, RD_KAFKA_PARTITION_UA);
    if (rd_kafka_share_subscribe(rks, list)) {
        fprintf(stderr, "drain: subscribe failed\n");
        exit(2);
    }
    rd_kafka_topic_partition_list_destroy(list);
    while (t->records < want && now() < deadline) {
        rd_kafka_messages_t *batch = NULL;
        rd_kafka_error_t *error = rd_kafka_share_poll(rks, 100, &batch);
        if (error) {
            rd_kafka_error_destroy(error);
            continue;
        }
        if (!batch)
            continue;
        size_t n = rd_kafka_messages_count(batch);
        for (size_t i = 0; i < n; i++)
            count(t, rd_kafka_messages_get(batch, i));
        rd_kafka_messages_destroy(batch);
    }
    rd_kafka_error_t *error = rd_kafka_share_consumer_close(rks);
    if (error)
        rd_kafka_error_destroy(error);
    rd_kafka_share_destroy(rks);
}

int main(int argc, char **argv) {
    if (argc < 7 || (strcmp(argv[1], "plain") && strcmp(argv[1], "share"))) {
        fprintf(stderr, "usage: drain plain|share BOOTSTRAP TOPIC PARTITIONS RECORDS GROUP [key=value ...]\n");
        return 2;
    }
    int share = !strcmp(argv[1], "share");
    char err[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const char *settings[][2] = {{"bootstrap.servers", argv[2]}, {"group.id", argv[6]}};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        if (rd_kafka_conf_set(conf, settings[i][0], settings[i][1], err, sizeof err)) {
            fprintf(stderr, "drain: %s\n", err);
            return 2;
        }
    }
    if (!share && rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof err)) {
        fprintf(stderr, "drain: %s\n", err);
        return 2;
    }
    for (int i = 7; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "drain: not key=value: %s\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        if (rd_kafka_conf_set(conf, argv[i], eq + 1, err, sizeof err)) {
            fprintf(stderr, "drain: %s\n", err);
            return 2;
        }
    }
    long want = atol(argv[5]);
    double deadline = now() + 120;
    struct tally t = {0, 0, 0.0, 0.0};
    if (share)
        drain_share(conf, argv[3], want, deadline, &t);
    else
        drain_plain(conf, argv[3], atoi(argv[4]), want, deadline, &t);
    printf("%ld %ld %.6f\n", t.records, t.bytes, t.last - t.first);
    return t.records < want;
}
