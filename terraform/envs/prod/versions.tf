terraform {
  required_version = ">= 1.6.0"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.70, < 6.0"
    }
    random = {
      source  = "hashicorp/random"
      version = ">= 3.6, < 4.0"
    }
    archive = {
      source  = "hashicorp/archive"
      version = ">= 2.4, < 3.0"
    }
  }

  # The state holds the Redis auth token: keep it in an encrypted, versioned S3 bucket.
  # terraform init -backend-config="bucket=<state bucket>" -backend-config="key=toolrail/prod.tfstate" \
  #   -backend-config="region=<region>" -backend-config="encrypt=true" -backend-config="use_lockfile=true"
  backend "s3" {}
}
