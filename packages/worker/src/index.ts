export const PACKAGE_NAME = "@tapwire/worker";
