/* A job's events between the worker and a connection (server/worker.c): a
 * connection that takes events and then polls the job's wake descriptor
 * must be woken for everything pushed after its take. The take used to
 * drain the wake counter after taking the events, so an END pushed in
 * between lost its wake and the connection waited forever (seen once, under
 * ASan's timing, in e2e_serve_batch). This test widens that window: its
 * read() of the wake descriptor sleeps while another thread pushes the END. */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmocka.h>
#include "server/server_internal.h"

static int slow_fd = -1;
static atomic_int in_read;

/* read() for this executable (the server library linked in calls it): slow on the watched descriptor */
ssize_t read(int fd, void *buf, size_t n) {
    if (fd == slow_fd && slow_fd >= 0) {
        atomic_store(&in_read, 1);
        usleep(20000);
    }
    return syscall(SYS_read, fd, buf, n);
}

static void *push_end(void *p) {
    srv_job *j = p;
    while (!atomic_load(&in_read)) usleep(100);
    srv_job_end(j, 200, NULL, NULL);
    return NULL;
}

static void test_no_lost_wake(void **state) {
    (void)state;
    srv_job *j = calloc(1, sizeof *j);
    j->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_mutex_init(&j->mu, NULL);
    j->refs = 1;
    srv_job_text(j, 1, "x", 1); /* the connection has something to take */
    pthread_t t;
    pthread_create(&t, NULL, push_end, j);
    slow_fd = j->wake_fd;
    int ended = 0, seen_end = 0;
    for (int takes = 0; !seen_end; takes++) {
        if (takes) { /* what the connection does next: wait for news */
            struct pollfd p = {.fd = j->wake_fd, .events = POLLIN};
            if (poll(&p, 1, 2000) == 0) fail_msg("the END's wake was lost: the connection would wait forever");
        }
        srv_event *e = srv_job_take(j, &ended);
        while (e) {
            srv_event *n = e->next;
            seen_end |= e->kind == SRV_EV_END;
            free(e);
            e = n;
        }
        slow_fd = -1;
    }
    pthread_join(t, NULL);
    close(j->wake_fd);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_no_lost_wake)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
