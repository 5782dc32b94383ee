# cordon on Nomad: an api group of stateless `cordon serve --workers 0`
# processes and a worker group of `cordon worker` processes sharing one
# PostgreSQL. Step by step in docs/deploy.md. Secrets come from the Nomad
# variable nomad/jobs/cordon (CORDON_DB, CORDON_CLUSTER_KEY, TLS_CERT,
# TLS_KEY, optionally ANTHROPIC_API_KEY); nothing secret is in this file.
#
# Both groups use the docker driver with the image you built: the same image
# as on Kubernetes, and the docker driver's `security_opt` and `devices`
# give the worker exactly the exceptions it needs (see the worker task)
# where the exec driver offers no way to lift its /proc masking or add a
# device to the task's device cgroup.

variable "image" {
  type        = string
  description = "The cordon image: replace with your registry's copy."
  default     = "cordon:latest"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

job "cordon" {
  type        = "service"
  datacenters = var.datacenters

  group "api" {
    count = 2

    network {
      port "https" {
        static = 443
        to     = 8443
      }
      port "metrics" {
        to = 9090
      }
    }

    service {
      name     = "cordon-api"
      port     = "https"
      provider = "nomad"

      check {
        type            = "http"
        protocol        = "https"
        path            = "/health"
        interval        = "10s"
        timeout         = "3s"
        tls_skip_verify = true
      }
    }

    # Prometheus text, no auth: keep the port on the cluster network.
    service {
      name     = "cordon-api-metrics"
      port     = "metrics"
      provider = "nomad"
      tags     = ["prometheus"]
    }

    update {
      max_parallel     = 1
      min_healthy_time = "10s"
      healthy_deadline = "3m"
      auto_revert      = true
    }

    task "api" {
      driver = "docker"

      config {
        image   = var.image
        command = "cordon"
        # TLS ends in cordon itself (rustls): Nomad has no ingress of its
        # own. Behind a TLS-terminating load balancer, drop the two --tls
        # flags and the certificate template.
        args = [
          "serve",
          "--listen=0.0.0.0:8443",
          "--tls-cert=${NOMAD_SECRETS_DIR}/tls.crt",
          "--tls-key=${NOMAD_SECRETS_DIR}/tls.key",
          "--metrics-listen=0.0.0.0:9090",
          "--workers=0",
          "--data-dir=${NOMAD_TASK_DIR}/data",
        ]
        ports = ["https", "metrics"]
      }

      # CORDON_DB (the PostgreSQL URL with its password) and the cluster key
      # as environment variables, never in the job or on a command line.
      template {
        destination = "${NOMAD_SECRETS_DIR}/cordon.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/cordon" }}
          CORDON_DB={{ .CORDON_DB }}
          CORDON_CLUSTER_KEY={{ .CORDON_CLUSTER_KEY }}
          {{ end }}
        EOT
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/tls.crt"
        change_mode = "restart"
        data        = "{{ with nomadVar \"nomad/jobs/cordon\" }}{{ .TLS_CERT }}{{ end }}"
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/tls.key"
        change_mode = "restart"
        perms       = "600"
        data        = "{{ with nomadVar \"nomad/jobs/cordon\" }}{{ .TLS_KEY }}{{ end }}"
      }

      resources {
        cpu    = 500
        memory = 512
      }
    }
  }

  group "worker" {
    count = 2

    network {
      port "relay" {
        to = 8081
      }
      port "metrics" {
        to = 9090
      }
    }

    service {
      name     = "cordon-worker-metrics"
      port     = "metrics"
      provider = "nomad"
      tags     = ["prometheus"]
    }

    # Workers follow the queue through the Nomad Autoscaler (with its
    # Prometheus plugin): enough workers for the queued and running jobs,
    # four per worker (--workers=4). Each process reports the same numbers
    # from the one database, hence max rather than sum.
    scaling {
      enabled = true
      min     = 1
      max     = 20

      policy {
        cooldown            = "2m"
        evaluation_interval = "30s"

        check "queue" {
          source = "prometheus"
          query  = "ceil((max(cordon_jobs_queued) + max(cordon_jobs{state=\"running\"})) / 4)"

          strategy "pass-through" {}
        }
      }
    }

    task "worker" {
      driver = "docker"
      # Time for running jobs to end; a job still running when the task is
      # killed loses its lease and is retried by the lease policy.
      kill_timeout = "5m"

      config {
        image   = var.image
        command = "cordon"
        args = [
          "worker",
          "--data-dir=${NOMAD_TASK_DIR}/data",
          "--workers=4",
          # Within kill_timeout: then running jobs are cancelled.
          "--grace=270s",
          "--listen=0.0.0.0:8081",
          # The address API processes on other nodes reach this worker's
          # relay at: the node's address and the port Nomad mapped.
          "--advertise=http://${NOMAD_ADDR_relay}",
          "--metrics-listen=0.0.0.0:9090",
        ]
        ports = ["relay", "metrics"]

        # What the native sandbox needs, without `privileged`: cordon makes
        # a user namespace per sandbox and gets its capabilities there.
        # - seccomp=unconfined: Docker's default profile refuses unshare with
        #   namespace flags; cordon installs its own, stricter filter in
        #   every sandbox.
        # - apparmor=unconfined: docker-default refuses mount.
        # - systempaths=unconfined: the kernel lets a user namespace mount a
        #   fresh /proc only where an unmasked /proc is visible.
        # Docker mounts the task's cgroup read-only, so per-job memory limits
        # fall back to rlimits and the task's memory bounds all its jobs
        # (`cordon doctor` says which). For per-job cgroups, set
        # privileged = true instead (the client's docker plugin must allow
        # it with allow_privileged); the task's root is then the node's.
        security_opt = [
          "seccomp=unconfined",
          "apparmor=unconfined",
          "systempaths=unconfined",
        ]
        cap_drop = ["net_raw", "mknod", "audit_write"]

        # For the microvm backend (CORDON_BACKEND=microvm below), pass the
        # node's /dev/kvm: Docker adds it to the task's device cgroup too.
        # devices = [
        #   {
        #     host_path      = "/dev/kvm"
        #     container_path = "/dev/kvm"
        #   },
        # ]
      }

      env {
        CORDON_BACKEND = "native"
      }

      template {
        destination = "${NOMAD_SECRETS_DIR}/cordon.env"
        env         = true
        change_mode = "restart"
        data        = <<-EOT
          {{ with nomadVar "nomad/jobs/cordon" }}
          CORDON_DB={{ .CORDON_DB }}
          CORDON_CLUSTER_KEY={{ .CORDON_CLUSTER_KEY }}
          ANTHROPIC_API_KEY={{ .ANTHROPIC_API_KEY }}
          {{ end }}
        EOT
      }

      resources {
        cpu    = 4000
        memory = 4096
      }
    }
  }
}
